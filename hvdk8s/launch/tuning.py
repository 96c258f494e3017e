"""Settings hvdk8s gives Horovod and OpenMPI where the user has not, chosen from measurements
(`hvdk8s bench --only knobs,peers`; bench/results/README.md). Local launches and rendered MPIJobs
both take them from here."""
from __future__ import annotations

from typing import MutableMapping

HOROVOD_DEFAULTS: dict[str, str] = {}


def apply(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with each default added unless it already names that variable."""
    for name, value in HOROVOD_DEFAULTS.items():
        env.setdefault(name, value)
    return env
