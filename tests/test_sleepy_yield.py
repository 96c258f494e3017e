"""The sleepy yield (hvdk8s/native/sleepy_yield.c): built by pip install, preloaded into local ranks, and
a wait (a run of sched_yield() calls) that sleeps for the rest of the wait once another thread wanted its core."""
import os
import subprocess
import sys

from hvdk8s import tuning
from hvdk8s.launch import local

# A thread waiting as OpenMPI and Horovod do, sched_yield() in a loop for 1 s, on core 0; for its first
# 0.2 s a busy process shares that core. Prints the waiter's CPU time, wall time and calls.
WAIT_BESIDE_A_BUSY_THREAD = """
import os, subprocess, sys, time
os.sched_setaffinity(0, {0})
busy = subprocess.Popen([sys.executable, "-c", "import os, time; os.sched_setaffinity(0, {0}); "
                         "t = time.perf_counter()\\nwhile time.perf_counter() - t < 0.2: pass"], env={})
time.sleep(0.05)  # the busy process is running
wall, cpu = time.perf_counter(), time.thread_time()
calls = 0
while time.perf_counter() - wall < 1.0:
    os.sched_yield()
    calls += 1
busy.wait()
print(time.thread_time() - cpu, time.perf_counter() - wall, calls)
"""


def library():
    found = tuning.sleepy_yield_library()
    assert found is not None, "pip install builds hvdk8s/native/sleepy_yield.c (a C compiler is needed)"
    return found


def test_a_wait_that_met_a_busy_core_sleeps_for_the_rest_of_it():
    """Without it the loop spins on for the 0.8 s after the busy process ended (about 0.8 CPU-s on an
    idle machine; 0.08 CPU-s with it in one process alone, measured)."""
    env = {**os.environ, "LD_PRELOAD": str(library())}
    out = subprocess.run([sys.executable, "-c", WAIT_BESIDE_A_BUSY_THREAD], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    cpu, wall, calls = out.stdout.split()
    assert float(cpu) < 0.15 * float(wall), out.stdout
    assert int(calls) > 500, out.stdout  # it kept returning: a wait that sleeps, not one stuck


def test_local_ranks_get_it_ahead_of_their_own_preloads_unless_turned_off_or_alone():
    lib = str(library())
    assert local.environment(2, base={})["LD_PRELOAD"] == lib
    assert local.environment(2, base={"LD_PRELOAD": "libfoo.so:libbar.so"})["LD_PRELOAD"] == f"{lib} libfoo.so libbar.so"
    assert local.environment(2, base={"LD_PRELOAD": lib})["LD_PRELOAD"] == lib  # not twice
    off = local.environment(2, base={tuning.SLEEPY_YIELD_ENV: "0", "LD_PRELOAD": "libfoo.so"})
    assert off["LD_PRELOAD"] == "libfoo.so"
    assert "LD_PRELOAD" not in local.environment(1, base={})  # one rank waits for no peer


def test_ranks_with_several_intra_op_threads_do_not_get_it():
    assert tuning.preloads({"OMP_NUM_THREADS": "1"}) == str(library())
    for threads in ("4", None):
        env = {} if threads is None else {"OMP_NUM_THREADS": threads}
        assert tuning.preloads(env) is None, threads
