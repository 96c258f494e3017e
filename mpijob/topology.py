"""How a job's ranks map onto nodes and worker pods.

GPU jobs get one worker pod per node holding all of that node's GPUs, so ranks on a node talk over
NVLink / shared memory and only the cross-node hop uses the network: slotsPerWorker = GPUs per node,
workers = total GPUs / GPUs per node. CPU jobs get `workers` pods of `ranks_per_worker` slots.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    workers: int
    slots_per_worker: int
    gpus_per_worker: int  # 0 for CPU jobs

    @property
    def ranks(self) -> int:
        return self.workers * self.slots_per_worker

    @property
    def one_worker_per_node(self) -> bool:
        return self.gpus_per_worker > 0


def plan(resources) -> Topology:
    """The topology for a job file's `resources` (already validated: GPUs fill whole nodes)."""
    if resources.gpus:
        per_node = min(resources.gpus, resources.gpus_per_node)
        return Topology(workers=resources.gpus // per_node, slots_per_worker=per_node, gpus_per_worker=per_node)
    return Topology(workers=resources.workers or 1, slots_per_worker=resources.ranks_per_worker, gpus_per_worker=0)
