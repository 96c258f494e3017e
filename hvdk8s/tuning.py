"""Settings hvdk8s gives OpenMPI and Horovod unless the user's environment names them, chosen from
measurements (`hvdk8s bench --only knobs,peers`, bench/results/README.md). Local launches and
rendered MPIJobs both take DEFAULTS from here, and the sleepy yield's preload (`preloads`).

OMPI_MCA_mpi_yield_when_idle=1: a rank waiting in MPI (Horovod's background thread, between and during
allreduces) yields its core instead of spinning on it. On 2 shared cores with a second 2-rank job
beside it, a 2-rank MLP step took 2.07x as long as torch DDP's with OpenMPI's default and 1.39x with
this; on an idle machine it was also faster (47 against 55 ms; DDP 66 ms).

The sleepy yield (hvdk8s/native/sleepy_yield.c, preloaded into single-threaded ranks of local launches
and, by the launcher's wait, of MPIJobs): a yield is still a busy wait, and Horovod's background
threads meet every cycle, so one rank's thread waits nearly all the time (4.98 CPU-s in 5 s of an idle 2-rank job). The preloaded
sched_yield keeps yielding while no other thread wants the core, and sleeps for the rest of a wait once
one did. Beside a second 2-rank job the MLP step went from 1.17x to 1.04x DDP's (sleeping from the first
yield: 0.96x, but 1.07-1.14x idle, where polling is what keeps an allreduce fast).
HVDK8S_SLEEPY_YIELD=0 turns it off. hvdk8s.torch's optimizer also waits asleep by itself (without it).
"""
from __future__ import annotations

import importlib.machinery
from pathlib import Path
from typing import MutableMapping, Optional

DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1"}
SLEEPY_YIELD_ENV = "HVDK8S_SLEEPY_YIELD"  # "0": every yield stays a yield


def sleepy_yield_library() -> Optional[Path]:
    """The built sleepy yield (pip builds it beside this module where a C compiler is found), or None."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_sleepy_yield{suffix}").is_file():
            return here / f"_sleepy_yield{suffix}"
    return None


def preloads(env: MutableMapping[str, str]) -> Optional[str]:
    """LD_PRELOAD for ranks started with `env`: the sleepy yield ahead of what env preloads, or None
    where it is off, not built, or the ranks run more than one intra-op thread (OMP_NUM_THREADS other
    than 1, a precaution: libtorch's own thread waits call sched_yield too, and one run of a 1-rank
    2-thread MLP step measured 1.24x plain PyTorch's with it preloaded, a recheck 1.08x against 1.07x
    without; single-threaded ranks are what was measured)."""
    library = sleepy_yield_library()
    if library is None or env.get(SLEEPY_YIELD_ENV, "1") == "0" or env.get("OMP_NUM_THREADS") != "1":
        return None
    if any(c in str(library) for c in " :"):
        return None  # LD_PRELOAD splits at spaces and colons: such a path cannot be preloaded
    others = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != str(library)]
    return " ".join([str(library), *others])


def apply(env: MutableMapping[str, str], *, ranks: int) -> MutableMapping[str, str]:
    """`env` (with the ranks' OMP_NUM_THREADS) with each default added unless it already names that
    variable, and, for more than one rank, the sleepy yield preloaded (`preloads`; a single rank has no
    peer to wait for)."""
    for name, value in DEFAULTS.items():
        env.setdefault(name, value)
    preload = preloads(env) if ranks > 1 else None
    if preload is not None:
        env["LD_PRELOAD"] = preload
    return env
