"""The job's tuning profile (hvdk8s/tuning.py, `resources.tuning`): computed once from the job and its
placement, shown whole in the rendered MPIJob (GPU jobs get none of the CPU-box settings), the same in a
real local rank's environment, applied from inside a rank that no hvdk8s launcher started; and the gate
on hvdk8s's use of Horovod's private parts (hvdk8s/_torch_launch.py), which falls back to Horovod's public
path, saying why, when the version check or the one-tensor self-check fails."""
import os
import re
import subprocess
import sys

import pytest
import yaml

from hvdk8s import tuning
from hvdk8s.launch import local
from hvdk8s.mpijob import render
from hvdk8s.spec import load_job

from conftest import RANK_SCRIPTS, ROOT, cli, invoke, rank_results, run_ranks, sleepy_negotiation_library

pytestmark = pytest.mark.after_the_node  # its rank tests: a third rank stream (tests/workgroups.py)

GOLDEN = ROOT / "tests" / "golden"
GPU_CASES = ("gpu-1x8", "gpu-4x8-rdma", "gpu-4x8-tcp", "nfs-cached", "s3-cached", "single-node")
# Everything the shared-cpu profile may set; HVDK8S_TUNING names the profile and is always there.
CPU_BOX = tuning.SHARED_CPU_VARIABLES


def launcher(spec) -> tuple[dict, list[str]]:
    """The launcher's plain env and the names its mpirun forwards to every rank (-x)."""
    job = render.mpijob(spec)
    container = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    command = container["command"]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), names
    return ({e["name"]: e.get("value") for e in container["env"]},
            [a for i, a in enumerate(command) if i and command[i - 1] == "-x"])


def rendered(case: str, *overrides: str) -> tuple[dict, list[str]]:
    return launcher(load_job(GOLDEN / case / "job.yaml", list(overrides)))


def profile_of(env: dict) -> dict:
    return {k: v for k, v in env.items() if k in (tuning.PROFILE_ENV, *CPU_BOX)}


# --- one function, two back ends ------------------------------------------------------------------

def test_auto_is_the_cpu_box_profile_without_gpus_and_nothing_with_them():
    lib, rules = "/lib/sleepy.so", "/lib/rules.conf"
    cpu = tuning.profile_env("auto", tuning.Placement(ranks=2, gpus=False, library=lib, rules=rules), {})
    assert cpu == {tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS, "LD_PRELOAD": lib,
                   "OMPI_MCA_btl_tcp_rdma_pipeline_frag_size": "262144",
                   "OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_dynamic_rules_filename": rules}
    alone = tuning.profile_env("auto", tuning.Placement(ranks=1, gpus=False, library=lib, rules=rules), {})
    assert alone == {tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS, **tuning.SINGLE_RANK}  # no peer to wait for
    elastic = tuning.profile_env("auto", tuning.Placement(ranks=2, gpus=False, elastic=True, library=lib, rules=rules),
                                 {})
    assert elastic == {tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS}  # peers may join; Gloo, not MPI
    for ranks in (1, 8):  # one GPU too: a script's raw hvd.allreduce would wait for a 20 ms cycle
        assert tuning.profile_env("auto", tuning.Placement(ranks=ranks, gpus=True, library=lib, rules=rules), {}) == \
            {tuning.PROFILE_ENV: "none"}
    assert tuning.profile_env("none", tuning.Placement(ranks=2, gpus=False, library=lib, rules=rules), {}) == \
        {tuning.PROFILE_ENV: "none"}
    forced = tuning.profile_env("shared-cpu", tuning.Placement(ranks=2, gpus=True, library=lib, rules=rules), {})
    assert forced == cpu
    no_library = tuning.profile_env("auto", tuning.Placement(ranks=2, gpus=False, library=None), {})
    assert not {"LD_PRELOAD", *tuning.allreduce_rules("")} & set(no_library)  # not built, or another MPI
    assert tuning.TCP_FRAGMENTS.items() <= no_library.items()  # any Open MPI's TCP; other MPIs ignore OMPI_MCA_


def test_the_users_own_settings_stay_and_their_preloads_follow_the_library():
    lib = "/lib/sleepy.so"
    placement = tuning.Placement(ranks=2, gpus=False, library=lib)
    own = tuning.profile_env("auto", placement, {"OMPI_MCA_mpi_yield_when_idle": "0", "LD_PRELOAD": "a.so:b.so"})
    assert "OMPI_MCA_mpi_yield_when_idle" not in own and own["LD_PRELOAD"] == f"{lib} a.so b.so"
    assert not set(tuning.MALLOC) & set(tuning.profile_env("auto", placement, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}))
    off = tuning.profile_env("auto", placement, {tuning.SLEEPY_NEGOTIATION_ENV: "0"})
    assert "LD_PRELOAD" not in off
    # A job that names any of Open MPI's coll/tuned settings keeps its collectives as it says, whole.
    ruled = tuning.Placement(ranks=2, gpus=False, library=lib, rules="/lib/rules.conf")
    assert set(tuning.allreduce_rules("")) <= set(tuning.profile_env("auto", ruled, {}))
    own = tuning.profile_env("auto", ruled, {"OMPI_MCA_coll_tuned_allreduce_algorithm": "6"})
    assert not set(tuning.allreduce_rules("")) & set(own)
    own = tuning.profile_env("auto", ruled, {"OMPI_MCA_btl_tcp_rdma_pipeline_frag_size": "4194304"})
    assert "OMPI_MCA_btl_tcp_rdma_pipeline_frag_size" not in own


def test_the_preload_is_only_for_the_open_mpi_it_was_written_for():
    assert tuning.open_mpi_series("mpirun (Open MPI) 4.1.4\n\nReport bugs to ...") == (4, 1)
    assert tuning.open_mpi_series("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6") == (4, 1)
    assert tuning.open_mpi_series("mpirun (Open MPI) 5.0.3") == (5, 0)
    assert tuning.open_mpi_series("HYDRA build details:\n    Version: 4.1.2") is None  # MPICH
    assert tuning.local_library() == str(sleepy_negotiation_library())  # this machine's is Open MPI 4.1
    assert tuning.local_rules() == str(tuning.ALLREDUCE_RULES) and tuning.ALLREDUCE_RULES.is_file()


@pytest.mark.parametrize("case", GPU_CASES)
def test_a_gpu_jobs_mpijob_has_none_of_the_cpu_box_settings(case):
    env, forwarded = rendered(case)
    assert profile_of(env) == {tuning.PROFILE_ENV: "none"}, case
    assert not set(CPU_BOX) & set(forwarded)


def test_a_one_gpu_job_keeps_horovods_cycle():
    env, _ = rendered("gpu-1x8", "resources.gpus=1")
    assert profile_of(env) == {tuning.PROFILE_ENV: "none"}
    # the single-rank cycle was measured on CPU only: not even a chosen shared-cpu gives a GPU rank it
    forced = tuning.profile_env("shared-cpu", tuning.Placement(ranks=1, gpus=True), {})
    assert forced[tuning.PROFILE_ENV] == "shared-cpu" and "HOROVOD_CYCLE_TIME" not in forced
    assert tuning.profile_env("shared-cpu", tuning.Placement(ranks=1, gpus=False), {})["HOROVOD_CYCLE_TIME"] == "20"


def test_the_cpu_mpijob_shows_the_whole_profile_as_plain_env_forwarded_to_every_rank():
    env, forwarded = rendered("cpu")
    assert profile_of(env) == {tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS, **tuning.TCP_FRAGMENTS,
                               "LD_PRELOAD": tuning.IMAGE_SLEEPY_NEGOTIATION,
                               **tuning.allreduce_rules(tuning.IMAGE_ALLREDUCE_RULES)}
    assert set(profile_of(env)) <= set(forwarded)
    alone, _ = rendered("cpu", "resources.workers=1", "resources.ranks_per_worker=1")
    assert profile_of(alone) == {tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS, **tuning.SINGLE_RANK}
    # The launcher's wait adds nothing at run time: the command is the wait, then mpirun as rendered.
    _, job = render.render(load_job(GOLDEN / "cpu" / "job.yaml"))
    command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--") + 1] == "mpirun" and "LD_PRELOAD" not in command[:command.index("--")]


def test_the_job_file_chooses_the_profile():
    none, _ = rendered("cpu", "resources.tuning=none")
    assert profile_of(none) == {tuning.PROFILE_ENV: "none"}
    forced, _ = rendered("gpu-1x8", "resources.tuning=shared-cpu")
    assert set(profile_of(forced)) == {tuning.PROFILE_ENV, *tuning.DEFAULTS, *tuning.TCP_FRAGMENTS, "LD_PRELOAD",
                                       *tuning.allreduce_rules("")}
    own, _ = rendered("cpu", "kubernetes.env={LD_PRELOAD: /opt/mine.so, OMPI_MCA_mpi_yield_when_idle: '0'}")
    assert own["LD_PRELOAD"] == f"{tuning.IMAGE_SLEEPY_NEGOTIATION} /opt/mine.so"
    assert own["OMPI_MCA_mpi_yield_when_idle"] == "0"
    secret, _ = rendered("cpu", "kubernetes.secret_env={MALLOC_TRIM_THRESHOLD_: {secret: s, key: k}}")
    assert secret["MALLOC_TRIM_THRESHOLD_"] is None and secret["MALLOC_MMAP_THRESHOLD_"]  # by reference, once


def test_a_bad_profile_is_named_by_its_field():
    result = invoke("validate", str(GOLDEN / "cpu" / "job.yaml"), "--set", "resources.tuning=fast")
    assert result.exit_code == 2 and "resources.tuning" in result.output + result.stderr, result.output


def test_local_ranks_get_the_profile_of_the_job():
    base = {k: v for k, v in os.environ.items() if k not in (tuning.PROFILE_ENV, *CPU_BOX)}
    assert profile_of(local.environment(2, base=base)) == {
        tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS, **tuning.TCP_FRAGMENTS,
        "LD_PRELOAD": str(sleepy_negotiation_library()), **tuning.allreduce_rules(str(tuning.ALLREDUCE_RULES))}
    assert profile_of(local.environment(2, base=base, profile="none")) == {tuning.PROFILE_ENV: "none"}
    assert profile_of(local.environment(1, base=base, elastic=True)) == {tuning.PROFILE_ENV: "shared-cpu",
                                                                        **tuning.DEFAULTS}


def test_a_rank_no_hvdk8s_launcher_started_applies_what_it_can_and_names_the_rest():
    env = {"OMPI_COMM_WORLD_SIZE": "2"}
    notes = tuning.in_rank(env, gpus=False)
    assert env == {"OMPI_COMM_WORLD_SIZE": "2", tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS,
                   **tuning.TCP_FRAGMENTS, **tuning.allreduce_rules(str(tuning.ALLREDUCE_RULES))}
    assert len(notes) == 1 and f"LD_PRELOAD={sleepy_negotiation_library()}" in notes[0]
    alone = {}
    assert tuning.in_rank(alone, gpus=False) == [] and alone["HOROVOD_CYCLE_TIME"] == "20"
    on_gpu = {}
    assert tuning.in_rank(on_gpu, gpus=True) == [] and on_gpu == {tuning.PROFILE_ENV: "none"}
    launched = {tuning.PROFILE_ENV: "none", "OMPI_COMM_WORLD_SIZE": "1"}
    assert tuning.in_rank(launched, gpus=False) == [] and launched == {tuning.PROFILE_ENV: "none",
                                                                      "OMPI_COMM_WORLD_SIZE": "1"}


# --- real ranks -----------------------------------------------------------------------------------

@pytest.mark.ranks
def test_a_local_cpu_rank_gets_exactly_what_the_mpijob_renders(tmp_path):
    """The same job, rendered and launched here with as many ranks: the profile's variables of a real rank
    are the MPIJob's, the paths of the library and of the allreduce rules aside (the image's there, the
    package's here), and init adds none."""
    out = tmp_path / "out"
    out.mkdir()
    job = {"name": "tuned", "framework": "pytorch",
           "entrypoint": {"script": str(RANK_SCRIPTS / "tuning_env.py"), "args": [str(out)]},
           "resources": {"workers": 1, "ranks_per_worker": 2, "cpu": "2", "memory": "4Gi"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    proc = cli("launch", "--local", "-np", "2", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, _ = launcher(load_job(path))
    expected = profile_of(env)
    expected["LD_PRELOAD"] = expected["LD_PRELOAD"].replace(tuning.IMAGE_SLEEPY_NEGOTIATION,
                                                            str(sleepy_negotiation_library()))
    expected.update(tuning.allreduce_rules(str(tuning.ALLREDUCE_RULES)))
    for rank in rank_results(out):
        assert rank["given"] == expected and rank["after_init"] == expected, (rank, expected)


@pytest.mark.ranks
def test_ranks_started_by_plain_mpirun_apply_the_profile_themselves(tmp_path):
    """No hvdk8s launcher: each rank's init puts the MCA and malloc settings where MPI_Init and glibc read
    them, and rank 0 alone names the preload it cannot load from inside itself, with the remedy."""
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (tuning.PROFILE_ENV, *CPU_BOX)}
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    proc = subprocess.run(local.command([sys.executable, str(RANK_SCRIPTS / "tuning_env.py"), str(out)], 2),
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in rank_results(out):
        assert rank["given"] == {} and rank["after_init"] == {tuning.PROFILE_ENV: "shared-cpu", **tuning.DEFAULTS,
                                                             **tuning.TCP_FRAGMENTS,
                                                             **tuning.allreduce_rules(str(tuning.ALLREDUCE_RULES))}
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "cannot be loaded from inside a rank" in line]
    assert len(said) == 1 and "LD_PRELOAD=" in said[0], proc.stdout + proc.stderr


PRIVATE_PATH_MODES = {
    "as-written": None,
    "version": "Horovod 0.28.1 is not 0.0.0",
    "self-check": "their self-check allreduced",
    "signature": "their self-check failed: TypeError: ",
    "late-wait": "their sleeping wait returned before the allreduce was done",
}


@pytest.fixture(scope="module")
def private_paths(tmp_path_factory):
    """tests/ranks/private_path.py through every mode in one launch: each mode's results, and rank 0's
    stderr lines from its `MODE` line to the next."""
    out = tmp_path_factory.mktemp("private-path")
    proc = run_ranks("private_path.py", str(out), *PRIVATE_PATH_MODES)
    said, mode = {}, None
    for line in re.sub(r"\[\d+,\d+\]<std(?:out|err)>:", "", proc.stderr).splitlines():  # mpirun's rank tags
        if line.startswith("MODE "):
            mode = line[len("MODE "):]
            said[mode] = []
        elif mode is not None:
            said[mode].append(line)
    assert list(said) == list(PRIVATE_PATH_MODES), proc.stderr
    return rank_results(out), said


@pytest.mark.ranks
@pytest.mark.parametrize("mode, why", PRIVATE_PATH_MODES.items())
def test_the_private_gradient_path_runs_only_where_it_was_checked(private_paths, mode, why):
    results, said = private_paths
    lines = [line for line in said[mode] if "take Horovod's own launch" in line]
    for rank in results:
        assert rank[mode] == {"direct": why is None, "averaged": True}, (mode, rank)
    if why is None:
        assert lines == [], lines
    else:
        assert len(lines) == 1 and why in lines[0], (mode, lines)  # one line, from rank 0
