"""The README is a user's guide that stays true. Everything is read out of README.md (and docs/*.md), so a
change there is tested as written:

- every command in its ```bash blocks is one this file knows how to check, and is checked: hvdk8s's local
  verbs run for real here (the quickstart's 2-rank launch included), its cluster verbs run against an API
  server that is not there and must get as far as trying to reach it (so their arguments parse and the job
  validates), `kubectl apply -k DIR` builds DIR with `kubectl kustomize`, `pip install` names extras
  setup.py defines, `docker build` names a Dockerfile that exists;
- every ```yaml block is a job file, or a part of one that validates in an example job's place;
- every ```python block's lines are in the example file linked just before it, every ```dockerfile block
  passes hadolint, and the sample output of the quickstart is what the launch prints;
- every relative link and anchor in README.md and docs/*.md resolves.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BIN = Path(sys.executable).parent  # the venv's hvdk8s, as `. .venv/bin/activate` puts it on PATH
CLUSTER_VERBS = {"status", "logs", "wait", "list", "delete"}


def blocks(path: Path, lang: str) -> list[tuple[int, str]]:
    """(offset, body) of each fenced block of `lang` in a Markdown file."""
    return [(m.start(), m.group(2)) for m in FENCE.finditer(path.read_text()) if m.group(1) == lang]


def commands(path: Path = README) -> list[list[str]]:
    """Every command of the file's bash blocks, as argv (comments dropped, quotes as the shell reads them)."""
    return [shlex.split(line, comments=True) for _, body in blocks(path, "bash") for line in body.splitlines()
            if shlex.split(line, comments=True)]


def kind(argv: list[str]) -> str:
    """How a README command is checked: 'local' (runs here), 'cluster' (needs a cluster), or what it is."""
    if argv[0] == "hvdk8s":
        verb = argv[1]
        if verb in CLUSTER_VERBS or (verb == "launch" and "--local" not in argv and "--dry-run" not in argv):
            return "cluster"
        return "local" if verb in {"validate", "render", "launch"} else f"unknown hvdk8s verb {verb}"
    if argv[:3] == ["kubectl", "apply", "-k"]:
        return "local"
    if argv[:2] == ["pip", "install"]:
        return "pip"
    if argv[:2] == ["docker", "build"]:
        return "docker"
    if argv in (["bash", "scripts/demo.sh"], ["bash", "scripts/test.sh"]):
        return "lead"
    if argv == [".", ".venv/bin/activate"]:
        return "activate"
    return "unknown"


def user_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of examples/, where the README's commands run as a user in a clone would (they write there)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


# --- the commands ---------------------------------------------------------------------------------

def test_readme_leads_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    lead = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert lead == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert all((ROOT / c.split()[1]).is_file() for c in lead)
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_command_the_readme_shows_is_one_this_test_checks():
    unknown = [shlex.join(c) for c in commands() if kind(c).startswith("unknown")]
    assert not unknown, f"README commands this test does not know how to check (teach kind() about them): {unknown}"
    shown = {shlex.join(c) for c in commands()}
    # What the README must show a user: the quickstart's launch, validate, render, the script job, a dry run.
    assert {"hvdk8s launch --local -np 2 examples/digits.yaml", "hvdk8s validate examples/digits.yaml",
            "hvdk8s launch --local -np 2 examples/script/job.yaml",
            "hvdk8s launch examples/digits.yaml --dry-run"} <= shown, shown
    assert any(c.startswith("hvdk8s render ") for c in shown)


def test_demo_sh_is_the_quickstart_launch():
    """`bash scripts/demo.sh` runs the set-up, then exactly the README's quickstart launch."""
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    launch = re.search(r"^exec \.venv/bin/(hvdk8s launch .*?) \"\$@\"$", demo, re.M).group(1)
    assert shlex.split(launch) in commands()


def test_activate_names_the_venv_the_set_up_makes():
    assert [".", ".venv/bin/activate"] in commands()
    assert "VENV=${HVDK8S_VENV:-$ROOT/.venv}" in (ROOT / "scripts" / "setup.sh").read_text()


def setup_extras() -> set[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    extras = next(k.value for k in call.keywords if k.arg == "extras_require")
    return {ast.literal_eval(key) for key in extras.keys}


def test_pip_installs_name_extras_that_setup_py_defines():
    installs = [c for c in commands() if kind(c) == "pip"]
    assert installs
    for argv in installs:
        target = argv[-1]
        assert argv[2:-1] == ["-e"] and re.fullmatch(r"\.(\[[\w,]+\])?", target), argv
        named = set(target[2:-1].split(",")) if "[" in target else set()
        assert named <= setup_extras(), f"{shlex.join(argv)}: no such extra {named - setup_extras()}"
    text = README.read_text()
    table = text[text.index("| extra | for |"):].split("\n\n", 1)[0]
    table = re.findall(r"^\| `([\w`, ]+)` \|", table, re.M)
    listed = {e.strip(" `") for row in table for e in row.split(",")}
    assert listed == setup_extras(), "the README's table of extras differs from setup.py's extras_require"


def test_docker_builds_name_a_dockerfile_that_exists():
    builds = [c for c in commands() if kind(c) == "docker"]
    assert builds
    for argv in builds:
        assert (ROOT / argv[argv.index("-f") + 1]).is_file() and argv[-1] == ".", argv


def is_launch(argv: list[str]) -> bool:
    return argv[:2] == ["hvdk8s", "launch"] and "--local" in argv


def run_as_shown(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """A local README command exactly as written, which must succeed; `kubectl apply -k DIR` as `kubectl
    kustomize DIR` (the same build, without a cluster to apply it to)."""
    if argv[:3] == ["kubectl", "apply", "-k"]:
        kubectl = shutil.which("kubectl")
        assert kubectl, "kubectl is missing: scripts/setup.sh installs it (Debian kubernetes-client)"
        argv = [kubectl, "kustomize", *argv[3:]]
    proc = run(argv, cwd, user_env())
    said = shlex.join(argv)
    assert proc.returncode == 0, f"{said}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, f"{said}\n{proc.stderr[-3000:]}"
    return proc


def test_readme_commands_run_as_shown(workdir):
    """validate, render, `kubectl apply -k` and the dry-run launch, in the README's order (a render's folder is
    what the next kubectl builds)."""
    for argv in [c for c in commands() if kind(c) == "local" and not is_launch(c)]:
        proc = run_as_shown(argv, workdir)
        if argv[0] == "kubectl" or "--dry-run" in argv:
            assert {d["kind"] for d in yaml.safe_load_all(proc.stdout)} == {"ConfigMap", "MPIJob"}, argv


@pytest.mark.ranks
def test_readme_launches_run_as_shown(workdir):
    """The local launches the README shows (the quickstart's 2 ranks, the factories job, the script job), each
    exactly as written, epochs and all (digits trains in well under a second an epoch); the quickstart prints
    what the README says it prints."""
    launched = {argv[-1]: run_as_shown(argv, workdir).stdout for argv in commands() if is_launch(argv)}
    assert set(launched) == {"examples/digits.yaml", "examples/factories/job.yaml", "examples/script/job.yaml"}
    assert "done: test accuracy" in launched["examples/digits.yaml"]
    # The factories job as it is, under PyTorch (test_user_code.py runs it under TensorFlow, its factory changed).
    factories = launched["examples/factories/job.yaml"]
    assert "job own-factories: pytorch my_pkg.models:torch_mlp on my_pkg.data:noisy_digits, 2 ranks" in factories
    assert float(re.search(r"done: test accuracy ([\d.]+)%", factories).group(1)) >= 93, factories
    assert "test accuracy" in launched["examples/script/job.yaml"]
    check_quickstart_output(launched["examples/digits.yaml"])
    # The digits job file as it is, under PyTorch (test_tensorflow.py runs it under TensorFlow, framework changed).
    assert "job digits-mlp: pytorch mlp on digits, 2 ranks, compression none" in launched["examples/digits.yaml"]
    assert float(re.search(r"done: test accuracy ([\d.]+)%", launched["examples/digits.yaml"]).group(1)) >= 95


def check_quickstart_output(stdout: str) -> None:
    """The README's sample of the quickstart's output: its first line as printed (the job's summary does not
    depend on the machine), and every other line's shape, numbers aside."""
    at = README.read_text().index("hvdk8s launch --local -np 2 examples/digits.yaml")
    sample = next(body for offset, body in blocks(README, "text") if offset > at).splitlines()
    lines = stdout.splitlines()
    assert sample[0] in lines, f"{sample[0]!r} not in the launch's output:\n{stdout[-2000:]}"
    for line in sample[1:]:
        if line == "...":
            continue
        parts = re.split(r"([0-9a-f]{16}|\d+(?:\.\d+)?)", line)  # hashes and numbers vary from run to run
        shape = "".join(re.escape(p) if i % 2 == 0 else "[0-9a-f]{16}" if len(p) == 16 else r"\d+(?:\.\d+)?"
                        for i, p in enumerate(parts))
        assert any(re.fullmatch(shape, got) for got in lines), f"no line of the launch looks like {line!r}"


def test_the_validate_errors_shown_are_what_validate_says(workdir):
    """The README's sample of `hvdk8s validate` on a bad job (a misspelt field, an unknown model), line by line;
    a line ending in `...` is abridged there."""
    text = README.read_text()
    sample = next(body for offset, body in blocks(README, "text") if offset > text.index("Unknown keys are errors"))
    job = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    job["training"]["batchsize"] = 64
    job["model"]["name"] = "vgg"
    (workdir / "bad.yaml").write_text(yaml.safe_dump(job))
    proc = run(["hvdk8s", "validate", "bad.yaml"], workdir, user_env(), timeout=300)
    assert proc.returncode == 2, proc.stderr
    said = proc.stderr.splitlines()
    for line in sample.splitlines():
        shown = line.removesuffix(", ...")
        assert any(got == line or (shown != line and got.startswith(shown)) for got in said), (line, said)


def unreachable_kubeconfig(tmp_path: Path) -> tuple[Path, str]:
    """A kubeconfig naming an API server on a port where nothing listens (found free, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = f"https://127.0.0.1:{port}"
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "readme",
              "clusters": [{"name": "readme", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
              "users": [{"name": "readme", "user": {"token": "readme"}}],
              "contexts": [{"name": "readme", "context": {"cluster": "readme", "user": "readme"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, server


def test_readme_cluster_commands_reach_for_the_cluster(workdir):
    """Each cluster command exactly as the README shows it, against a cluster that is not there: it parses, its
    job validates, and it fails the way a user without a cluster would see it (exit 2, one line naming the
    server), not with a usage error or a traceback."""
    pytest.importorskip("kubernetes", reason="the [cluster] extra")
    kubeconfig, server = unreachable_kubeconfig(workdir)
    env = user_env(KUBECONFIG=str(kubeconfig))
    cluster = [c for c in commands() if kind(c) == "cluster"]
    assert {c[1] for c in cluster} == CLUSTER_VERBS | {"launch"}, cluster
    for argv in cluster:
        proc = run(argv, workdir, env, timeout=120)
        said = shlex.join(argv)
        assert proc.returncode == 2, f"{said}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert f"cannot reach the Kubernetes API server at {server}" in proc.stderr, f"{said}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr and "Usage:" not in proc.stderr, f"{said}\n{proc.stderr}"


# --- what the README quotes --------------------------------------------------------------------------

def base_job(fragment: dict) -> Path:
    """The example job a README fragment takes the place of a part of."""
    if "entrypoint" in fragment:
        return ROOT / "examples" / "script" / "job.yaml"
    if any("factory" in (fragment.get(k) or {}) for k in ("model", "dataset")):
        return ROOT / "examples" / "factories" / "job.yaml"
    return ROOT / "examples" / "digits.yaml"


def merged(base: dict, part: dict) -> dict:
    """`base` with `part` laid over it, mappings merged key by key; a model or dataset is replaced whole (each is
    one of a built-in, a factory or a path)."""
    return {**base, **{k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict)
                       and k not in ("model", "dataset") else v for k, v in part.items()}}


YAML_BLOCKS = [(md, i) for md in [README, *DOCS] for i in range(len(blocks(md, "yaml")))]


@pytest.mark.parametrize("md,index", YAML_BLOCKS, ids=[f"{md.name}-{i}" for md, i in YAML_BLOCKS])
def test_yaml_shown_is_a_valid_job_or_part_of_one(md, index, workdir):
    """A whole job (it has a name) validates as it is; a part is laid over the example job it belongs to
    (beside it, so its factories and script are found) and the result validates."""
    fragment = yaml.safe_load(blocks(md, "yaml")[index][1])
    base = base_job(fragment)
    job = fragment if "name" in fragment else merged(yaml.safe_load(base.read_text()), fragment)
    path = workdir / base.relative_to(ROOT).parent / f"shown-{index}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    proc = run([str(BIN / "hvdk8s"), "validate", str(path)], workdir, user_env(), timeout=300)
    assert proc.returncode == 0, f"{md.name} yaml block {index}:\n{yaml.safe_dump(fragment)}\n{proc.stderr}"


def python_quotes() -> list[tuple[Path, int, list[Path]]]:
    """(markdown file, offset, the example files linked since the block before) for each python block."""
    quotes = []
    for md in [README, *DOCS]:
        text = md.read_text()
        fences = [(m.start(), m.end(), m.group(1)) for m in FENCE.finditer(text)]
        for start, _, lang in fences:
            if lang == "python":
                after = max((end for _, end, _ in fences if end <= start), default=0)
                linked = [(md.parent / p).resolve() for p in re.findall(r"\]\(([^)#\s]+\.py)\)", text[after:start])]
                quotes.append((md, start, linked))
    return quotes


@pytest.mark.parametrize("md,offset,linked", python_quotes(),
                         ids=lambda v: v.name if isinstance(v, Path) else None)
def test_quoted_code_is_the_tested_file(md, offset, linked):
    assert linked, f"{md.name}: a python block at {offset} without a link to the example file it quotes"
    block = dict(blocks(md, "python"))[offset]
    sources = "\n".join(p.read_text() for p in linked)
    missing = [line for line in block.splitlines() if line.strip() not in ("", "...") and line not in sources]
    assert not missing, f"{md.name}: lines not in {[p.name for p in linked]}: {missing}"


def test_the_dockerfile_the_readme_shows_passes_hadolint(tmp_path):
    from test_dockerfile import hadolint

    shown = blocks(README, "dockerfile")
    assert shown, "the README shows how to extend the image"
    for i, (_, body) in enumerate(shown):
        path = tmp_path / f"Dockerfile.readme-{i}"
        path.write_text(body)
        proc = hadolint(path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert body.splitlines()[0].startswith("FROM ") and body.rstrip().splitlines()[-1] == "USER mpiuser"


# --- links ---------------------------------------------------------------------------------------

def anchors(md: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (outside code blocks)."""
    text = FENCE.sub("", md.read_text())
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def links(md: Path) -> list[str]:
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", md.read_text()))
            if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("md", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(md):
    broken = []
    for target in links(md):
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{md.relative_to(ROOT)}: {broken}"


def test_the_readme_links_every_doc_and_stays_a_guide():
    linked = {(README.parent / p.partition("#")[0]).resolve() for p in links(README)}
    assert set(DOCS) <= linked, f"docs not linked from the README: {set(DOCS) - linked}"
    assert len(README.read_text().splitlines()) <= 400, "the README is a user's guide: details go to docs/"


def test_no_file_keeps_a_merge_conflicts_markers():
    """A merge left unresolved in a doc or a source file (a doc once kept one through a merge commit)."""
    marker = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    kept = [path for path in tracked.splitlines()
            if path.endswith((".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg"))
            and (ROOT / path).is_file() and marker.search((ROOT / path).read_text(errors="replace"))]
    assert not kept, kept
