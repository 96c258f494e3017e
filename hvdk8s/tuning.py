"""The job's tuning profile: settings hvdk8s gives OpenMPI, Horovod and glibc's malloc, chosen from
measurements on a 2-core CPU machine (`hvdk8s bench --only knobs,peers`, bench/results/README.md,
docs/performance.md), and only where those measurements apply.

`resources.tuning` in the job file picks the profile: `shared-cpu` (everything below), `none` (Horovod's,
Open MPI's and glibc's own defaults) or `auto` (the default): `shared-cpu` for a CPU job, `none` for a job
whose ranks have GPUs, where none of this was measured. `profile_env` is the one place that turns the
choice and the ranks' placement into variables: the local launcher puts them in the ranks' environment, the
MPIJob renderer writes them into the launcher's `env` (forwarded to every rank), HVDK8S_TUNING naming the
profile applied, so a rank adds nothing the MPIJob does not show. A rank started some other way (plain
horovodrun, or alone) applies what it can itself at init (`in_rank`): the MCA variables before MPI_Init,
the malloc thresholds through mallopt, the single-rank cycle; the preload it cannot, and says so.

OMPI_MCA_mpi_yield_when_idle=1: a rank waiting in MPI (Horovod's background thread, between and during
allreduces) yields its core instead of spinning on it. On 2 shared cores with a second 2-rank job
beside it, a 2-rank MLP step took 2.07x as long as torch DDP's with OpenMPI's default and 1.39x with
this; on an idle machine it was also faster (47 against 55 ms; DDP 66 ms).

The sleepy negotiation (hvdk8s/native/sleepy_negotiation.c, preloaded into the ranks of multi-rank jobs,
LD_PRELOAD in the local ranks' environment and in the MPIJob's env, with the image's path): every cycle Horovod's background threads meet in a
small bitwise MPI_Allreduce, and the rank that arrives first polls for the other; the ranks' offset
drifts until one thread polls for the whole cycle (2.99 CPU-s in 3 s of an idle 2-rank job). The
preloaded MPI_Allreduce waits for those bitwise reductions asleep and passes every other allreduce
(gradients) to Open MPI as before. MLP, 2 ranks, DDP = 1.00x: 0.95x idle and 0.94x beside a second 2-rank
job (ResNet-20: 1.03x and 0.87x), against 0.92-0.96x and 1.08-1.11x without it.
HVDK8S_SLEEPY_NEGOTIATION=0 turns it off. hvdk8s.torch's optimizer also waits asleep by itself.

ALLREDUCE RULES (hvdk8s/native/allreduce-rules.conf, Open MPI 4.1's coll/tuned rules file, read through
OMPI_MCA_coll_tuned_use_dynamic_rules=1 and OMPI_MCA_coll_tuned_dynamic_rules_filename): allreduces of
16 MB and more among 2 ranks take Open MPI's ring; smaller ones, and every allreduce among 3 ranks or more,
keep Open MPI's own choice (the file's entries apply by communicator size, checked: an entry for 3 with a
slow algorithm slowed 4 ranks and not 2). A 2-rank step of a 29.4M-parameter MLP (gradients of 50-67 MB
a tensor) took 0.975x (`knobs`) to 0.91x (ad hoc runs) the time without them on one machine, and
0.89-1.00x across 2 emulated nodes (`hvdk8s bench --only network`: unshaped, 10 and 1 Gbit/s; since the
allocator settings shortened the step's CPU work, 1.01x at 1 Gbit/s and 1.05-1.08x faster). At 2 ranks
a node (4 ranks) the ring took 1.21x Open MPI's own choice once TCP_FRAGMENTS were in (2114 against
1744 ms at 1 Gbit/s; before them 0.91x): hence 2 ranks only. The small models' steps (many small tensors,
ResNet-20, the Transformer: messages under 16 MB) are unchanged (docs/performance.md). The file ships in
the package (local ranks) and at IMAGE_ALLREDUCE_RULES in the images (the MPIJob names that path); where it
is missing Open MPI keeps its own choice. Not for elastic jobs (Gloo's allreduce, not Open MPI's), and left
out where the job's env names any OMPI_MCA_coll_tuned_ variable of its own.

TCP_FRAGMENTS (OMPI_MCA_btl_tcp_rdma_pipeline_frag_size=262144, for more than one rank, not elastic):
past its first 128 KB, Open MPI 4.1 sends a large message over TCP as one fragment of up to 2 GB (its
default). Across 2 emulated nodes at 1 Gbit/s (2 x 1 rank, 29.4M-parameter MLP) the step's large
allreduces then ran at 50-70 % of the link (a Horovod timeline), and one 118 MB allreduce alone took twice
the wire's time (1942 ms against 944) with the sleepy negotiation preloaded; in 256 KB fragments they ran
at 87-96 % and that allreduce took 994 ms, and the step took 0.80-0.87x the time uncompressed and
0.72-0.79x with fp16 (ad hoc runs; fragments of 64 KB to 256 KB alike, 1 MB and more less); in
`hvdk8s bench --only network` the step without them took 1.20x (fp16 1.43x), and at 2 ranks a node,
under Open MPI's own algorithm, 1.35x (fp16 1.17x). Unchanged (0.97-1.03x) at 10 Gbit/s and on unshaped
links then; since the allocator settings shortened the step's CPU work, 1.19-1.23x at 1 Gbit/s but 0.85x
at 10 Gbit/s and unshaped (two runs; ad hoc 0.97x at 10 Gbit/s, and 1 or 4 MB fragments no better:
docs/performance.md), kept for the slow links they were found on. Ranks on one machine meet in shared
memory, not TCP. Inert where the MPI is not Open MPI.

MALLOC: glibc's allocator hands a freed block over 128 KB back to the kernel (its mmap threshold, raised
to the largest block freed so far up to 32 MB, and trimming the heap's top past twice that), so a training
step that frees and reallocates activations of a few MB, or gradients of tens of MB, faults their pages in
again every step, the kernel zeroing pages on cores the training needs: a 2-rank ResNet-20 rank took ~10k
page faults a step (DDP's 3-9k); one step of a 29.4M-parameter MLP (weights of 50 and 67 MB) 28.7k.
Fixed thresholds of 1 GiB keep blocks up to 1 GiB on the heap and its top up to 1 GiB: ResNet-20 20-140
faults a step, and that 2-rank step 0.90x DDP's time against 1.04x without (docs/performance.md: DDP gains
as much from them); the MLP none, its step 0.60x the time at one rank, and across 2 emulated nodes at
1 Gbit/s 0.93x uncompressed, 0.86x fp16, 0.73x PowerSGD (ad hoc, 2 launches each, with 4 GiB and 16 GiB;
`hvdk8s bench --only network`: without them 1.06-1.10x at 1 Gbit/s, 1.16-1.34x on faster links). They
were 32 MB and 256 MB, which left the MLP's faults as they were. A rank's resident memory then stays near
its peak instead of falling between steps (the MLP's 1016 -> 1060 MB; the small models' unchanged).
1 GiB: what mallopt's int takes (in_rank). Where the rank's environment tunes glibc's malloc itself
(GLIBC_TUNABLES naming glibc.malloc), these are left out.

TF_ALLOCATOR (TF_CPU_ALLOCATOR_USE_BFC=1): TensorFlow allocates a CPU tensor from threads of its own pools,
whose glibc arenas map any block over 64 MB afresh whatever the thresholds, so MALLOC alone left a Keras
step of the MLP 49k faults (73.7k without) and its memory 1281 MB (953). TensorFlow's own best-fit
allocator, the one it uses on GPUs, keeps the blocks: one process, one thread, batch 32, the MLP's step
0.63x the time (316 against 498 ms), 1 fault a step, 986 MB; ResNet-20's step unchanged (200 against
201 ms), 710 MB against 762. PyTorch ignores the variable. TensorFlow reads it when it first allocates, so
in_rank applies it only where nothing was allocated before Horovod's init.

SINGLE_RANK (HOROVOD_CYCLE_TIME=20, milliseconds), for a job of one rank for good, on CPU only, whatever
the profile (the profile of a rank that sees a GPU is `none` under `auto`, and even a `shared-cpu` GPU job
keeps Horovod's cycle: there a script's raw hvd.allreduce per step would wait for the cycle): Horovod's
background thread wakes every cycle (1 ms by default) even with no peer, and on CPU each wake-up
interrupts one of the step's intra-op threads, which the others then wait for at the region's barrier.
A 1-rank Transformer step took 1.053x and 1.077x a plain PyTorch step with the 1 ms cycle (two runs
of 10 interleaved rounds), 0.973x and 1.025x with 20 ms (10 and 60 rounds; this machine's drift between
runs is 10-40%); taking turns with plain (`hvdk8s bench --only wrapper`), 0.996-1.005x. Its background
thread wakes 49 times a second instead of 899. At one rank hvdk8s's own collectives (allreduce,
metric_*, broadcast_state, the resume broadcast) return without Horovod, so only a script's raw
hvd.allreduce waits for the cycle, up to 20 ms. Elastic ranks keep Horovod's cycle (peers may join).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, MutableMapping, Optional

PROFILES = ("auto", "shared-cpu", "none")  # resources.tuning
PROFILE_ENV = "HVDK8S_TUNING"  # the profile whose settings a launcher put in the ranks' environment
MALLOC: dict[str, str] = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
TF_ALLOCATOR: dict[str, str] = {"TF_CPU_ALLOCATOR_USE_BFC": "1"}
ALLOCATORS: dict[str, str] = {**MALLOC, **TF_ALLOCATOR}  # what a baseline in bench/ gets to compare like with like
DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1", **ALLOCATORS}
SINGLE_RANK: dict[str, str] = {"HOROVOD_CYCLE_TIME": "20"}
TCP_FRAGMENTS: dict[str, str] = {"OMPI_MCA_btl_tcp_rdma_pipeline_frag_size": str(256 << 10)}
# What launchers tell a rank of the job's size before MPI or Gloo starts (Open MPI, Horovod's Gloo, MPICH's
# and Intel MPI's Hydra, MVAPICH, Slurm); a process with none of them was started on its own.
WORLD_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")
SLEEPY_NEGOTIATION_ENV = "HVDK8S_SLEEPY_NEGOTIATION"  # "0": Horovod's negotiation polls as Open MPI does
# Where the images (Dockerfile.gpu) put the built library: a fixed path, so the MPIJob can name it.
IMAGE_SLEEPY_NEGOTIATION = "/opt/hvdk8s/lib/libhvdk8s_sleepy_negotiation.so"
ALLREDUCE_RULES = Path(__file__).parent / "native" / "allreduce-rules.conf"  # package data (setup.py)
IMAGE_ALLREDUCE_RULES = "/opt/hvdk8s/lib/allreduce-rules.conf"  # linked there with the library
COLL_TUNED = "OMPI_MCA_coll_tuned_"  # a job's env naming one of these keeps Open MPI's collectives as it says
# The Open MPI the preload was written and measured against (its ops' symbol names, pointer handles, and
# non-blocking collectives progressed in MPI_Test): 4.1 (Debian's 4.1.4 here, Ubuntu 24.04's 4.1.6 in the
# images). The library checks the same at run time (MPI_Get_library_version) and passes through elsewhere.
OPEN_MPI_SERIES = (4, 1)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters for MALLOC_*_THRESHOLD_


@dataclass(frozen=True)
class Placement:
    """What the profile depends on: how many ranks the job starts, whether they see GPUs, whether the job is
    elastic (its size may change), and the paths of the sleepy negotiation and of the allreduce rules where
    the ranks run (None: absent, or not the Open MPI they were written for)."""

    ranks: int
    gpus: bool
    elastic: bool = False
    library: Optional[str] = None
    rules: Optional[str] = None


def resolve(choice: str, gpus: bool) -> str:
    """The profile `choice` stands for: `auto` is `shared-cpu` without GPUs, `none` with them."""
    if choice not in PROFILES:
        raise ValueError(f"tuning must be one of {', '.join(PROFILES)}, got {choice!r}")
    if choice == "auto":
        return "none" if gpus else "shared-cpu"
    return choice


def profile_env(choice: str, placement: Placement, env: Mapping[str, str]) -> dict[str, str]:
    """The variables the profile gives ranks placed as `placement`, whose own environment (the user's or the
    job's `kubernetes.env`) is `env`: PROFILE_ENV, then, for `shared-cpu`, each setting `env` does not name
    (`defaults`), HOROVOD_CYCLE_TIME for a job of one rank for good that sees no GPU (even where
    `shared-cpu` is chosen for a GPU job), and, for more than one rank that is not elastic (a single rank has
    no peer to wait for or send to), TCP_FRAGMENTS and, where the MPI is the Open MPI they were written for,
    LD_PRELOAD with the sleepy negotiation ahead of `env`'s own preloads and the allreduce rules. Only these
    are added to the ranks' environment: nothing else, nowhere else."""
    profile = resolve(choice, placement.gpus)
    out = {PROFILE_ENV: profile}
    if profile == "none":
        return out
    wanted = defaults(env)
    if placement.ranks == 1 and not placement.elastic and not placement.gpus:  # measured on CPU only
        wanted.update(SINGLE_RANK)
    out.update({name: value for name, value in wanted.items() if name not in env})
    # Elastic jobs run on Gloo, whose negotiation, allreduce and TCP are not Open MPI's; one rank has no peer.
    if placement.ranks == 1 or placement.elastic:
        return out
    out.update({name: value for name, value in TCP_FRAGMENTS.items() if name not in env})
    preload = preloads(env, placement.library)
    if preload is not None:
        out["LD_PRELOAD"] = preload
    if placement.rules is not None and not any(name.startswith(COLL_TUNED) for name in env):
        out.update(allreduce_rules(placement.rules))
    return out


def allreduce_rules(path: str) -> dict[str, str]:
    """The Open MPI variables that make ranks read the allreduce rules at `path` (ALLREDUCE RULES above)."""
    return {f"{COLL_TUNED}use_dynamic_rules": "1", f"{COLL_TUNED}dynamic_rules_filename": path}


# Every variable the `shared-cpu` profile may give ranks, whatever their placement (PROFILE_ENV aside).
SHARED_CPU_VARIABLES = (*DEFAULTS, *SINGLE_RANK, *TCP_FRAGMENTS, "LD_PRELOAD", *allreduce_rules(""))


def sleepy_negotiation_library() -> Optional[Path]:
    """The built sleepy negotiation (pip builds it beside this module where a C compiler is found), or None."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_sleepy_negotiation{suffix}").is_file():
            return here / f"_sleepy_negotiation{suffix}"
    return None


def open_mpi_series(version_text: str) -> Optional[tuple[int, int]]:
    """(major, minor) of Open MPI from `mpirun --version` or MPI_Get_library_version, or None for another MPI."""
    found = re.search(r"Open MPI\)? v?(\d+)\.(\d+)", version_text)
    return (int(found.group(1)), int(found.group(2))) if found else None


@functools.lru_cache(maxsize=None)
def local_open_mpi() -> bool:
    """Whether this machine's mpirun is the Open MPI that the library and the rules were written for
    (OPEN_MPI_SERIES)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return False
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return open_mpi_series(text) == OPEN_MPI_SERIES


def local_library() -> Optional[str]:
    """The sleepy negotiation for ranks on this machine: the built library where local_open_mpi(), else None."""
    library = sleepy_negotiation_library()
    return str(library) if library is not None and local_open_mpi() else None


def package_rules() -> Optional[str]:
    """The allreduce rules the package ships, or None where its file is missing."""
    return str(ALLREDUCE_RULES) if ALLREDUCE_RULES.is_file() else None


def local_rules() -> Optional[str]:
    """The allreduce rules for ranks on this machine: the package's file where local_open_mpi(), else None."""
    return package_rules() if local_open_mpi() else None


def gpus_visible(env: Mapping[str, str]) -> bool:
    """Whether processes started here with `env` would see an NVIDIA GPU, without loading CUDA: the driver
    lists one and CUDA_VISIBLE_DEVICES does not hide them all."""
    hidden = env.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def preloads(env: Mapping[str, str], library: Optional[str]) -> Optional[str]:
    """LD_PRELOAD for ranks started with `env`: `library` (the sleepy negotiation) ahead of what env preloads,
    or None where it is off or absent. It only changes how a Horovod background thread waits for its peers'
    bitwise reductions (Open MPI's MPI_BAND/MPI_BOR), so any rank may have it: other MPIs, programs
    without MPI and every other collective pass straight through."""
    if library is None or env.get(SLEEPY_NEGOTIATION_ENV, "1") == "0":
        return None
    if any(c in library for c in " :"):
        return None  # LD_PRELOAD splits at spaces and colons: such a path cannot be preloaded
    others = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != library]
    return " ".join([library, *others])


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


def launched_size(env: Mapping[str, str]) -> int:
    """The job's size as the launcher's variables tell it (1 where none does: started on its own)."""
    sizes = [env[name] for name in WORLD_SIZE_VARIABLES if name in env]
    return max((int(s) for s in sizes if s.isdigit()), default=1)


def in_rank(env: MutableMapping[str, str], gpus: bool) -> list[str]:
    """The profile applied from inside a rank about to start Horovod (MPI_Init reads `env`), where no hvdk8s
    launcher did (no PROFILE_ENV in `env`; with it, every setting is in `env` already): the `auto` profile
    as `profile_env` computes it for this process (its size from the launcher's variables), each variable
    put in `env`, the malloc thresholds also given to this process's allocator (glibc reads MALLOC_* only at
    start). Returns the lines to log: what could not be applied from here (the preload) and its remedy."""
    if PROFILE_ENV in env:
        return []
    placement = Placement(ranks=launched_size(env), gpus=gpus, elastic=elastic(env),
                          library=str(sleepy_negotiation_library() or "") or None,
                          rules=package_rules())
    wanted = profile_env("auto", placement, env)
    preload = wanted.pop("LD_PRELOAD", None)
    env.update(wanted)
    for name, option in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD), ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD)):
        if name in wanted:
            _mallopt(option, int(wanted[name]))
    if preload is None or placement.library in env.get("LD_PRELOAD", "").replace(":", " ").split():
        return []
    return [f"hvdk8s: tuning {wanted[PROFILE_ENV]}: the sleepy negotiation cannot be loaded from inside a rank, so "
            "Horovod's per-cycle negotiation polls a core; start the ranks with `hvdk8s launch`, or give them "
            f"LD_PRELOAD={placement.library} (horovodrun/mpirun -x LD_PRELOAD)"]


def _mallopt(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None).mallopt(option, value)
    except (OSError, AttributeError):  # not glibc: its allocator has no such thresholds
        pass


def link_image_library() -> Optional[str]:
    """Link the allreduce rules at IMAGE_ALLREDUCE_RULES and the built sleepy negotiation at
    IMAGE_SLEEPY_NEGOTIATION, where rendered MPIJobs name them (an image's build, Dockerfile.gpu); why the
    library could not be, or None."""
    _link(Path(IMAGE_ALLREDUCE_RULES), ALLREDUCE_RULES)
    library = sleepy_negotiation_library()
    if library is None:
        return "the sleepy negotiation was not built (a C compiler is needed)"
    _link(Path(IMAGE_SLEEPY_NEGOTIATION), library)
    return None


def _link(target: Path, source: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    target.symlink_to(source)


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m hvdk8s.tuning --image-library DEVICE`, in Dockerfile.gpu: the library linked for the image;
    a CPU image fails without it (its jobs' profile preloads it), a GPU image builds without it."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m hvdk8s.tuning", description=main.__doc__)
    parser.add_argument("--image-library", choices=("cpu", "gpu"), required=True, metavar="DEVICE")
    device = parser.parse_args(argv).image_library
    why = link_image_library()
    if why is None:
        return 0
    print(f"hvdk8s: {why}" + ("" if device == "cpu" else "; GPU jobs' `auto` tuning does not preload it"),
          file=sys.stderr)
    return 1 if device == "cpu" else 0


if __name__ == "__main__":
    raise SystemExit(main())
