"""Settings hvdk8s gives OpenMPI, Horovod and glibc's malloc unless the user's environment names them,
chosen from measurements (`hvdk8s bench --only knobs,peers`, bench/results/README.md, docs/performance.md).
Local launches and rendered MPIJobs both take DEFAULTS from here (`defaults`), and the
sleepy negotiation's preload (`preloads`).

OMPI_MCA_mpi_yield_when_idle=1: a rank waiting in MPI (Horovod's background thread, between and during
allreduces) yields its core instead of spinning on it. On 2 shared cores with a second 2-rank job
beside it, a 2-rank MLP step took 2.07x as long as torch DDP's with OpenMPI's default and 1.39x with
this; on an idle machine it was also faster (47 against 55 ms; DDP 66 ms).

The sleepy negotiation (hvdk8s/native/sleepy_negotiation.c, preloaded into the ranks of multi-rank local
launches and, by the launcher's wait, of MPIJobs): every cycle Horovod's background threads meet in a
small bitwise MPI_Allreduce, and the rank that arrives first polls for the other; the ranks' offset
drifts until one thread polls for the whole cycle (2.99 CPU-s in 3 s of an idle 2-rank job). The
preloaded MPI_Allreduce waits for those bitwise reductions asleep and passes every other allreduce
(gradients) to Open MPI as before. MLP, 2 ranks, DDP = 1.00x: 0.95x idle and 0.94x beside a second 2-rank
job (ResNet-20: 1.03x and 0.87x), against 0.92-0.96x and 1.08-1.11x without it.
HVDK8S_SLEEPY_NEGOTIATION=0 turns it off. hvdk8s.torch's optimizer also waits asleep by itself.

MALLOC: glibc's allocator hands a freed block over 128 KB back to the kernel (its mmap threshold, raised
to the largest block freed so far, and trimming the heap's top past twice that), so a training step that
frees and reallocates activations of a few MB faults their pages in again every step: a 2-rank ResNet-20
rank took ~10k page faults a step (DDP's 3-9k), the kernel zeroing pages on cores the training needs.
Fixed thresholds keep blocks up to 32 MB on the heap and its top up to 256 MB: 20-140 faults a step, and
that 2-rank step 0.90x DDP's time against 1.04x without (docs/performance.md: DDP gains as much from them).
A rank's resident memory then stays near its peak instead of falling between steps. Where the rank's
environment tunes glibc's malloc itself (GLIBC_TUNABLES naming glibc.malloc), these are left out.

SINGLE_RANK (HOROVOD_CYCLE_TIME=20, milliseconds), for a process that is Horovod's only rank for good
(`single_rank_defaults`; hvdk8s.torch.init and hvdk8s.tensorflow.init put it in the environment before
hvd.init()): Horovod's background thread wakes every cycle (1 ms by default) even with no peer, and on
CPU each wake-up interrupts one of the step's intra-op threads, which the others then wait for at the
region's barrier. A 1-rank Transformer step took 1.053x and 1.077x a plain PyTorch step with the 1 ms
cycle (two runs of 10 interleaved rounds), 0.973x and 1.025x with 20 ms (10 and 60 rounds; this
machine's drift between runs is 10-40%); taking turns with plain (`hvdk8s bench --only wrapper`),
0.996-1.005x. Its background thread wakes 49 times a second instead of 899. At one rank hvdk8s's own collectives
(allreduce, metric_*, broadcast_state, the resume broadcast) return without Horovod, so only a script's
raw hvd.allreduce waits for the cycle, up to 20 ms. Elastic ranks keep Horovod's cycle (peers may join).
"""
from __future__ import annotations

import importlib.machinery
from pathlib import Path
from typing import Mapping, MutableMapping, Optional

MALLOC: dict[str, str] = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1", **MALLOC}
SINGLE_RANK: dict[str, str] = {"HOROVOD_CYCLE_TIME": "20"}
# What launchers tell a rank of the job's size before MPI or Gloo starts (Open MPI, Horovod's Gloo, MPICH's
# and Intel MPI's Hydra, MVAPICH, Slurm); a process with none of them was started on its own.
WORLD_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")
SLEEPY_NEGOTIATION_ENV = "HVDK8S_SLEEPY_NEGOTIATION"  # "0": Horovod's negotiation polls as Open MPI does


def sleepy_negotiation_library() -> Optional[Path]:
    """The built sleepy negotiation (pip builds it beside this module where a C compiler is found), or None."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_sleepy_negotiation{suffix}").is_file():
            return here / f"_sleepy_negotiation{suffix}"
    return None


def preloads(env: MutableMapping[str, str]) -> Optional[str]:
    """LD_PRELOAD for ranks started with `env`: the sleepy negotiation ahead of what env preloads, or None
    where it is off or not built. It only changes how a Horovod background thread waits for its peers'
    bitwise reductions (Open MPI's MPI_BAND/MPI_BOR), so any rank may have it: other MPIs, programs
    without MPI and every other collective pass straight through."""
    library = sleepy_negotiation_library()
    if library is None or env.get(SLEEPY_NEGOTIATION_ENV, "1") == "0":
        return None
    if any(c in str(library) for c in " :"):
        return None  # LD_PRELOAD splits at spaces and colons: such a path cannot be preloaded
    others = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != str(library)]
    return " ".join([str(library), *others])


def defaults(env: Mapping[str, str]) -> dict[str, str]:
    """DEFAULTS as they apply to ranks given `env`: without MALLOC where GLIBC_TUNABLES tunes malloc
    (a user's own allocator settings are not mixed with these)."""
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return {name: value for name, value in DEFAULTS.items() if name not in MALLOC}
    return dict(DEFAULTS)


def elastic(env: Mapping[str, str]) -> bool:
    """Whether a rank with `env` runs under Horovod elastic (horovodrun sets HOROVOD_ELASTIC=1): its
    job's size may change."""
    return env.get("HOROVOD_ELASTIC") == "1"


def single_rank_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """SINGLE_RANK's settings that `env` does not name, for a process about to start Horovod with it, if
    `env` says it will be the job's only rank (every launcher variable present is 1, or none is) and not
    elastic (HOROVOD_ELASTIC=1: ranks may join); else none."""
    if elastic(env) or any(env.get(name, "1") != "1" for name in WORLD_SIZE_VARIABLES):
        return {}
    return {name: value for name, value in SINGLE_RANK.items() if name not in env}


def apply(env: MutableMapping[str, str], *, ranks: int) -> MutableMapping[str, str]:
    """`env` with each default added unless it already names that variable (`defaults`), and, for more
    than one rank, the sleepy negotiation preloaded (`preloads`; a single rank has no peer to wait for)."""
    for name, value in defaults(env).items():
        env.setdefault(name, value)
    preload = preloads(env) if ranks > 1 else None
    if preload is not None:
        env["LD_PRELOAD"] = preload
    return env
