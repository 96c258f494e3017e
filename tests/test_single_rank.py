"""A rank that is its job's only rank for good (hvdk8s/tuning.py SINGLE_RANK): hvdk8s's init gives
Horovod a 20 ms cycle on CPU unless the environment names one, says more ranks (or elastic ones) run or
that a launcher applied the job's tuning profile already, its
background thread then wakes ~50 times a second instead of ~1000, and hvdk8s's own collectives return
their one value without Horovod while a raw Horovod allreduce still works."""
import json
import os
import subprocess
import sys

import pytest

from hvdk8s import tuning

from conftest import RANK_SCRIPTS, ROOT, run_ranks

pytestmark = pytest.mark.ranks


def test_the_long_cycle_is_only_for_one_rank_for_good_on_cpu_and_never_over_the_users_own():
    def cycle(env: dict, gpus: bool = False):
        tuning.in_rank(env, gpus)
        return env.get("HOROVOD_CYCLE_TIME")

    assert cycle({}) == "20"  # started on its own: no launcher
    assert cycle({"OMPI_COMM_WORLD_SIZE": "1", "PMI_SIZE": "1"}) == "20"
    for variable in tuning.WORLD_SIZE_VARIABLES:
        assert cycle({variable: "2"}) is None, variable
    assert cycle({"OMPI_COMM_WORLD_SIZE": "1", "HOROVOD_ELASTIC": "1"}) is None
    assert cycle({"HOROVOD_CYCLE_TIME": "0.5"}) == "0.5"
    assert cycle({}, gpus=True) is None  # a rank that sees a GPU: `auto` is no tuning
    assert cycle({tuning.PROFILE_ENV: "shared-cpu"}) is None  # a launcher applied the profile: nothing added


def run_alone(framework: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in (*tuning.WORLD_SIZE_VARIABLES, tuning.PROFILE_ENV)
             and not k.startswith(("OMPI_", "HOROVOD_", "PMIX_"))}
    proc = subprocess.run([sys.executable, str(RANK_SCRIPTS / "single_rank.py"), framework], cwd=ROOT,
                          env={**clean, **env}, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_rank_alone_gets_the_long_cycle_and_its_collectives_return_at_once(framework):
    alone = run_alone(framework)
    assert alone["size"] == 1 and alone["cycle_time"] == tuning.SINGLE_RANK["HOROVOD_CYCLE_TIME"]
    assert alone["allreduce"] == [1.5, -2.0] and alone["copied"]
    assert alone["metric_sum"] == 2.5 and alone["metric_average"] == 4.0
    assert alone["raw_sum"] == [1.5, -2.0]  # Horovod's own collectives still run, within a cycle
    assert alone["broadcast_unchanged"] and alone["resumed"] == [0, {}]
    if framework == "pytorch":  # the thread's wake-ups: one framework shows it, the cycle is Horovod's
        own = run_alone(framework, HOROVOD_CYCLE_TIME="1")
        assert own["cycle_time"] == "1"
        # A 20 ms cycle wakes Horovod's thread at most 50 times a second however fast the machine (a busier
        # one wakes it less): 150 leaves room for the odd other wake-up. The 1 ms control shows that the
        # count tells the cycles apart.
        assert alone["wakeups_per_s"] < 150 < own["wakeups_per_s"], (alone, own)


def test_a_launcher_that_hides_the_size_is_named_on_stderr():
    """Were a launcher to tell a rank nothing of the job's size, the rank would start Horovod with the long
    cycle; Horovod then knows the size, and hvdk8s says what to set."""
    proc = run_ranks("unknown_launcher.py", np=2)
    assert proc.stdout.count("size 2") == 2, proc.stdout
    assert "HOROVOD_CYCLE_TIME=20 for a single rank, but this job has 2 ranks" in proc.stderr, proc.stderr
