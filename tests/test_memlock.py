"""The ranks' RDMA precondition (hvdk8s.launch.memlock), run for real under the locked-memory limits a
container runtime may give: unlimited, a hard limit a non-root rank can reach, or one it cannot."""
import os
import resource
import shutil
import subprocess
import sys

import pytest

from hvdk8s.launch import memlock

INF = resource.RLIM_INFINITY
SHOW = "import resource; print(resource.getrlimit(resource.RLIMIT_MEMLOCK))"


def run_under(soft, hard, *prefix, env=None):
    """`python -m hvdk8s.launch.memlock -- python -c SHOW` started with RLIMIT_MEMLOCK (SOFT, HARD)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))

    return subprocess.run([*prefix, sys.executable, "-m", "hvdk8s.launch.memlock", "--", sys.executable, "-c", SHOW],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit,
                          env={**os.environ, **(env or {})})


def can_raise_hard_limits() -> bool:
    try:
        current = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (current[0], INF))
        resource.setrlimit(resource.RLIMIT_MEMLOCK, current)
        return True
    except (ValueError, OSError):
        return False


needs_root = pytest.mark.skipif(not can_raise_hard_limits(), reason="setting an unlimited hard limit needs root")


@needs_root
def test_a_low_soft_limit_is_raised_to_an_unlimited_hard_one_and_the_rank_runs():
    proc = run_under(64 * 1024, INF)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"({INF}, {INF})" and proc.stderr == ""


def test_a_hard_limit_below_unlimited_stops_the_rank_with_one_line_naming_the_cause():
    proc = run_under(64 * 1024, 64 * 1024)
    assert proc.returncode == memlock.EXIT_CODE and proc.stdout == ""  # the command never ran
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "RDMA needs an unlimited locked-memory limit" in lines[0] and "64 KiB" in lines[0]
    assert "LimitMEMLOCK=infinity" in lines[0]


def test_the_soft_limit_is_raised_to_the_hard_one_before_it_is_judged():
    """Even where the hard limit cannot be unlimited (as on this machine), the rank raises its soft limit to it
    first: the message reports the raised value."""
    hard = min(resource.getrlimit(resource.RLIMIT_MEMLOCK)[1], 8 * 2**20)
    proc = run_under(64 * 1024, hard)
    assert proc.returncode == memlock.EXIT_CODE
    assert f"this container's is {memlock._size(hard)} (hard limit {memlock._size(hard)}" in proc.stderr


def test_only_each_nodes_first_rank_says_it():
    proc = run_under(8 * 2**20, 8 * 2**20, env={"OMPI_COMM_WORLD_LOCAL_RANK": "3"})
    assert proc.returncode == memlock.EXIT_CODE and proc.stderr == ""


@pytest.mark.skipif(not shutil.which("setpriv") or os.geteuid() != 0,
                    reason="setpriv (util-linux) as root is needed to drop to uid 1000")
def test_as_the_non_root_mpi_user(tmp_path):
    """What a rank in the pod is: uid 1000, no capabilities. It raises its soft limit to the hard one by
    itself, but cannot raise the hard one, and is stopped; with an unlimited hard limit (root-only to set
    up) it runs."""
    drop = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "--inh-caps=-all"]
    env = {"HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    stopped = run_under(64 * 1024, 128 * 1024, *drop, env=env)
    if "Permission denied" in stopped.stderr:
        pytest.skip("uid 1000 cannot read this checkout's interpreter or sources")
    assert stopped.returncode == memlock.EXIT_CODE, stopped.stderr
    assert "this container's is 128 KiB (hard limit 128 KiB" in stopped.stderr
    if can_raise_hard_limits():
        raised = run_under(64 * 1024, INF, *drop, env=env)
        assert raised.returncode == 0 and raised.stdout.strip() == f"({INF}, {INF})", raised.stderr


def test_usage_without_a_command():
    proc = subprocess.run([sys.executable, "-m", "hvdk8s.launch.memlock"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage" in proc.stderr
