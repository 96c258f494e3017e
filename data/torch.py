"""Rank-sharded PyTorch loaders over hvdk8s datasets."""
from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
import torch

from .sharding import EpochPlan, plan_epoch, step_counts


class Batch(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor
    global_count: int  # samples in this step across all ranks (weights this rank's loss)


class ShardedLoader:
    """Iterates this rank's disjoint part of a dataset, one epoch at a time.

    Call `set_epoch(e)` before each epoch (as with torch's DistributedSampler): the order is a function
    of (seed, epoch), so it changes every epoch and repeats for the same seed. Every rank yields the same
    number of batches; the last ones may be short or empty on some ranks (see `hvdk8s.data.sharding`).
    """

    def __init__(self, dataset, batch_size: int, *, rank: int, size: int, seed: int = 0, shuffle: bool = True,
                 steps_multiple: int = 1, device: torch.device | str | None = None):
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank, self.size = rank, size
        self.seed, self.shuffle = seed, shuffle
        self.steps_multiple = steps_multiple
        self.device = device
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self) -> EpochPlan:
        order = (self.dataset.epoch_order(self.seed, self.epoch) if self.shuffle
                 else np.arange(len(self.dataset)))
        return plan_epoch(order, self.rank, self.size, self.batch_size, self.steps_multiple)

    @property
    def global_counts(self):
        """Samples all ranks read at each step; the same every epoch (see hvdk8s.data.sharding)."""
        return step_counts(len(self.dataset), self.size, self.batch_size, self.steps_multiple)

    def __len__(self) -> int:
        return len(self.global_counts)

    def __iter__(self) -> Iterator[Batch]:
        plan = self.plan()
        for indices, global_count in zip(plan.batches(), plan.global_counts):
            x, y = self.dataset.take(indices)
            yield Batch(torch.from_numpy(np.ascontiguousarray(x)).to(self.device),
                        torch.from_numpy(np.ascontiguousarray(y)).to(self.device), int(global_count))
