"""Settings hvdk8s gives OpenMPI and Horovod unless the user's environment names them, chosen from
measurements (`hvdk8s bench --only knobs,peers`, bench/results/README.md). Local launches and
rendered MPIJobs both take them from here.

OMPI_MCA_mpi_yield_when_idle=1: a rank waiting in MPI (Horovod's background thread, between and during
allreduces) yields its core instead of spinning on it. On 2 shared cores with a second 2-rank job
beside it, a 2-rank MLP step took 2.07x as long as torch DDP's with OpenMPI's default and 1.39x with
this; on an idle machine it was also faster (47 against 55 ms; DDP 66 ms).
"""
from __future__ import annotations

from typing import MutableMapping

DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def apply(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with each default added unless it already names that variable."""
    for name, value in DEFAULTS.items():
        env.setdefault(name, value)
    return env
