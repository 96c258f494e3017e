"""Rank-sharded PyTorch loaders over hvdk8s datasets."""
from __future__ import annotations

import queue
import threading
from typing import Iterator, NamedTuple, Optional

import numpy as np
import torch

from .rankplans import EpochPlan, plan_epoch, step_counts


class Batch(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor
    global_count: int  # samples in this step across all ranks (weights this rank's loss)


class ShardedLoader:
    """Iterates this rank's disjoint part of a dataset, one epoch at a time.

    Call `set_epoch(e)` before each epoch (as with torch's DistributedSampler): the order is a function
    of (seed, epoch), so it changes every epoch and repeats for the same seed. Every rank yields the same
    number of batches; the last ones may be short or empty on some ranks (see `hvdk8s.data.rankplans`).

    `prefetch=n` reads up to n batches ahead on a background thread, so reading overlaps the training
    step; the batches and their order are the same as with 0 (read in the loop). `dataset.take` then runs
    on that thread: leave it at 0 for a dataset whose reads draw from a global RNG (random augmentation
    with torch's or NumPy's global generator), since those draws would interleave with the step's.
    """

    def __init__(self, dataset, batch_size: int, *, rank: int, size: int, seed: int = 0, shuffle: bool = True,
                 steps_multiple: int = 1, device: torch.device | str | None = None, prefetch: int = 0):
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank, self.size = rank, size
        self.seed, self.shuffle = seed, shuffle
        self.steps_multiple = steps_multiple
        self.device = device
        self.prefetch = prefetch
        self.epoch = 0
        self.order: Optional[np.ndarray] = None

    def set_epoch(self, epoch: int, order: Optional[np.ndarray] = None) -> None:
        """The epoch to read next; `order` replaces its global order (elastic training passes what is left
        of an epoch after the ranks changed: `hvdk8s.data.rankplans.unread_after`)."""
        self.epoch, self.order = epoch, order

    def epoch_order(self) -> np.ndarray:
        if self.order is not None:
            return self.order
        return self.dataset.epoch_order(self.seed, self.epoch) if self.shuffle else np.arange(len(self.dataset))

    def plan(self) -> EpochPlan:
        return plan_epoch(self.epoch_order(), self.rank, self.size, self.batch_size, self.steps_multiple)

    @property
    def global_counts(self):
        """Samples all ranks read at each step; the same every epoch (see hvdk8s.data.rankplans) unless
        `set_epoch` was given an order of another length."""
        n = len(self.dataset) if self.order is None else len(self.order)
        return step_counts(n, self.size, self.batch_size, self.steps_multiple)

    def __len__(self) -> int:
        return len(self.global_counts)

    def __iter__(self) -> Iterator[Batch]:
        plan = self.plan()
        steps = zip(plan.batches(), plan.global_counts)
        if self.prefetch <= 0:
            for indices, global_count in steps:
                x, y = self.dataset.take(indices)
                yield Batch(torch.from_numpy(np.ascontiguousarray(x)).to(self.device),
                            torch.from_numpy(np.ascontiguousarray(y)).to(self.device), int(global_count))
            return
        yield from self._prefetched(steps)

    def _prefetched(self, steps) -> Iterator[Batch]:
        # Pinned host memory lets the copy to the GPU be asynchronous: the step's kernels queue behind
        # it on the same stream, and the host goes on to the next step without waiting for it.
        cuda = self.device is not None and torch.device(self.device).type == "cuda"
        if cuda:  # the consumer's GPU, for the reader thread (a new thread starts on GPU 0)
            gpu = torch.device(self.device).index
            gpu = torch.cuda.current_device() if gpu is None else gpu
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            # Timed puts, so the reader notices a consumer that went away while the queue was full.
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    pass
            return False

        def read() -> None:
            try:
                if cuda:  # else pinning would open a context on GPU 0 from every rank of the node
                    torch.cuda.set_device(gpu)
                for indices, global_count in steps:
                    if stop.is_set():
                        return
                    x, y = (torch.from_numpy(np.ascontiguousarray(a)) for a in self.dataset.take(indices))
                    if cuda:
                        x, y = x.pin_memory(), y.pin_memory()
                    if not put((x, y, int(global_count))):
                        return
                put(None)  # the end of the epoch
            except BaseException as e:  # handed to the consumer, raised there at this batch
                put(e)

        reader = threading.Thread(target=read, name="hvdk8s-loader-prefetch", daemon=True)
        reader.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                x, y, global_count = item
                yield Batch(x.to(self.device, non_blocking=cuda), y.to(self.device, non_blocking=cuda), global_count)
        finally:
            # Also runs when the consumer stops early (break, close, garbage collection): the reader
            # ends after at most the read in progress. A collection on the reader thread itself (the
            # generator in a reference cycle) must not join that thread.
            stop.set()
            if reader is not threading.current_thread():
                reader.join()
