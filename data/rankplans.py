"""Which samples each rank reads in an epoch.

An epoch's order over all N samples comes from the dataset (a full permutation for data in memory,
a shard-by-shard block shuffle for data on disk), seeded by (seed, epoch): it changes between epochs
and repeats for the same seed. That order is cut into `size` contiguous parts whose lengths differ by
at most one, so every sample is read exactly once per epoch, by exactly one rank.

Ranks must run the same number of steps (each step is a collective allreduce), so every rank runs
`steps` batches; a rank whose part runs out first gets a shorter or empty last batch. The plan also
gives the global batch size of every step, which the trainer uses to weight each rank's loss so that
the averaged gradient is exactly the mean over the samples actually read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def part_bounds(n: int, rank: int, size: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous part of n items split into `size` parts (lengths differ by <= 1)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def epoch_rng(seed: int, epoch: int, *salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, *salt])


@dataclass(frozen=True)
class EpochPlan:
    """One rank's share of one epoch: `indices` in the order read, cut into `steps` batches."""

    indices: np.ndarray
    batch_size: int
    steps: int
    global_counts: np.ndarray  # samples read by all ranks together at each step

    def batches(self):
        for k in range(self.steps):
            yield self.indices[k * self.batch_size:(k + 1) * self.batch_size]


def plan_epoch(order: np.ndarray, rank: int, size: int, batch_size: int, steps_multiple: int = 1) -> EpochPlan:
    """Cut an epoch's global `order` into this rank's batches.

    `steps_multiple` rounds the step count up (with empty batches) so that gradient accumulation over
    that many backward passes always ends on a full group.
    """
    global_counts = step_counts(len(order), size, batch_size, steps_multiple)
    start, stop = part_bounds(len(order), rank, size)
    return EpochPlan(order[start:stop], batch_size, len(global_counts), global_counts)


def step_counts(n: int, size: int, batch_size: int, steps_multiple: int = 1) -> np.ndarray:
    """Samples read by all ranks together at each step of an epoch over n samples. Its length is the
    number of steps every rank runs. It depends on the sizes alone, never on the epoch's order."""
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    counts = np.array([np.subtract(*part_bounds(n, r, size)[::-1]) for r in range(size)])
    steps = math.ceil(math.ceil(n / size) / batch_size)
    steps = math.ceil(steps / steps_multiple) * steps_multiple
    k = np.arange(steps)[:, None]
    return np.clip(counts[None, :] - k * batch_size, 0, batch_size).sum(axis=1)


def unread_after(order: np.ndarray, size: int, batch_size: int, steps: int) -> np.ndarray:
    """What is left of an epoch's global `order` once `size` ranks have run `steps` batches of its plan
    (rank r has read the first steps * batch_size of its part), in the same order. Elastic training
    re-plans the rest over the ranks there are after a change, so no sample is read twice in an epoch."""
    keep = np.ones(len(order), dtype=bool)
    for rank in range(size):
        start, stop = part_bounds(len(order), rank, size)
        keep[start:min(stop, start + steps * batch_size)] = False
    return order[keep]
