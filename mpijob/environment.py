"""The environment of every rank. The ranks are started by mpirun on the launcher through ssh into the
workers, so they do not see the worker pods' environment: every variable they need is set on the
launcher and forwarded (-x), along with the image's PATH, and a GPU job's LD_LIBRARY_PATH."""
from __future__ import annotations

from hvdk8s import runfiles, tuning
from hvdk8s.core import layout
from hvdk8s.core.quantity import parse_quantity
from hvdk8s.faults import stall_env
from hvdk8s.spec import JOB_ENV, JobSpec

from . import network
from .topology import Topology

JOB_FILE = f"{layout.JOB_DIR}/job.yaml"
# The image's variables the ranks need. LD_LIBRARY_PATH only where GPUs are: CUDA images set it (the driver's
# libraries, which the NVIDIA runtime mounts), a CPU image does not, and mpirun begins the log of every job
# that forwards an unset variable with `Warning: could not find environment variable "LD_LIBRARY_PATH"`. A
# CPU job whose image needs it sets it in kubernetes.env (forwarded as all of that is).
FROM_IMAGE, FROM_GPU_IMAGE = ("PATH",), ("LD_LIBRARY_PATH",)


def hvdk8s_env(spec: JobSpec, topo: Topology) -> dict[str, str]:
    """What hvdk8s itself sets, from the job file's fields (a job's own `env` may not override these)."""
    # Rank 0's events as JSON lines, the one form every reader takes (`hvdk8s logs` draws them).
    env = {"PYTHONUNBUFFERED": "1", "HVDK8S_EVENTS": "json", JOB_ENV: JOB_FILE,
           **stall_env(spec.training.stall_timeout_seconds)}  # a hung rank ends the job, as locally
    if topo.gpus_per_worker:
        env.update(network.nccl_env(spec.resources, topo))
    else:
        # Whole cores per rank, in exact decimal arithmetic (a float is off for quantities like .1Ei).
        env["OMP_NUM_THREADS"] = str(max(1, int(parse_quantity(spec.resources.cpu) // topo.slots_per_worker)))
    if spec.cached_dataset is not None:
        env["HVDK8S_CACHE_DIR"] = spec.kubernetes.cache_dir  # where the init container synced the dataset
    env.update(runfiles.horovod_env(spec))  # timeline and autotune into the run directory (on a volume: checks)
    return env


def tuning_env(spec: JobSpec, topo: Topology) -> dict[str, str]:
    """The job's tuning profile (`resources.tuning`) for its ranks, with the image's sleepy negotiation and
    allreduce rules: all of it in the MPIJob's env, nothing added at run time. The job's own `env` keeps
    what it names."""
    placement = tuning.Placement(ranks=topo.ranks, gpus=bool(topo.gpus_per_worker),
                                 elastic=spec.training.elastic is not None, library=tuning.IMAGE_SLEEPY_NEGOTIATION,
                                 rules=tuning.IMAGE_ALLREDUCE_RULES)
    secret = spec.kubernetes.secret_env  # set by reference: the profile leaves those names to the job too
    own = {**spec.kubernetes.env, **dict.fromkeys(secret, "")}
    return {k: v for k, v in tuning.profile_env(spec.resources.tuning, placement, own).items() if k not in secret}


def rank_env(spec: JobSpec, topo: Topology) -> dict[str, str]:
    """Plain environment of every rank (secret-backed variables are added by reference elsewhere): hvdk8s's,
    the job's own `env`, the tuning profile (whose LD_PRELOAD keeps the job's own preloads after its own)."""
    return {**hvdk8s_env(spec, topo), **spec.kubernetes.env, **tuning_env(spec, topo)}


def forwarded(spec: JobSpec, topo: Topology) -> list[str]:
    """Names mpirun forwards to every rank (-x), each once."""
    image = FROM_IMAGE + (FROM_GPU_IMAGE if topo.gpus_per_worker else ())
    return list(dict.fromkeys([*image, *sorted(rank_env(spec, topo)), *sorted(spec.kubernetes.secret_env)]))
