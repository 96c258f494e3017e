"""How a job fails when a rank dies or hangs: the bounds set on purpose, in one place for the local
launcher and the rendered MPIJob.

A rank that exits ends the job at once (mpirun aborts the others; ranks die with their parent, see
`hvdk8s._adapter.die_with_parent`). A rank that hangs leaves the others blocked in a collective:
Horovod's stall inspector on rank 0 notices tensors that some ranks submitted and others did not,
warns after half the timeout naming the missing ranks, and shuts the job down after all of it.
"""
from __future__ import annotations

from typing import Optional


def stall_env(timeout_seconds: Optional[int]) -> dict[str, str]:
    """Horovod's stall check and shutdown for a job's `training.stall_timeout_seconds` (None: off)."""
    if not timeout_seconds:
        return {"HOROVOD_STALL_CHECK_DISABLE": "1"}
    return {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(max(1, timeout_seconds // 2)),
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(timeout_seconds)}
