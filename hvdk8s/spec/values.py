"""Value rules that more than one section of the job file shares: Kubernetes names checked by `k8snames`,
the keys of a Secret or ConfigMap, and the 32-bit bound of the MPI operator's counts."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from hvdk8s.core import k8snames

INT32_MAX = 2**31 - 1  # replicas, slotsPerWorker, Horovod's rank count: 32-bit in the operator and in Horovod

CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def k8s_valid(check, value: str) -> str:
    """VALUE if the k8snames CHECK finds nothing wrong, else ValueError with what it found."""
    problems = check(value)
    if problems:
        raise ValueError("; ".join(problems))
    return value


def _data_key(v: str) -> str:
    if not CONFIGMAP_KEY.match(v):
        raise ValueError(f"{v!r} is not a Secret or ConfigMap key (letters, digits, '-', '_', '.')")
    return v


# The name of a Secret or ConfigMap (a DNS subdomain), and a key of its data.
ObjectName = Annotated[str, AfterValidator(lambda v: k8s_valid(k8snames.dns1123_subdomain, v))]
DataKey = Annotated[str, AfterValidator(_data_key)]
