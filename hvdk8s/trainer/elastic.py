"""The shared epoch loop under Horovod elastic (`training.elastic`): training goes on while workers
leave and join.

What is committed (in memory, every `commit_every_steps` optimizer steps and at each epoch's end): the
model, the optimizer, the epoch, and the part of the epoch's global sample order not yet read. When the
workers change, every rank re-initialises Horovod, re-plans its loaders for the new rank and size
(`Steps.reshard`, which also rescales the learning rate), takes rank 0's committed state and trains on
from there: each sample is still read once per epoch. When a rank dies, the others first go back to
the last commit, so at most `commit_every_steps` steps are lost. Nothing before the elastic function is
collective, because a joining worker starts there: the checkpoint is read by rank 0 alone and shared by
the first sync.
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

import numpy as np

from hvdk8s.spec import JobSpec

from .job import Progress, Steps, announce, begin, end_epoch, finish


def run_elastic_epochs(spec: JobSpec, steps: Steps, *, resume: bool = True) -> dict[str, Any]:
    t = spec.training
    report, start_epoch = begin(spec, steps, resume=resume, broadcast=False)
    announce(spec, steps, steps.lr, report, start_epoch)
    # Rank 0's epoch wins at the first sync (the other ranks did not read the checkpoint).
    state = steps.elastic_state(epoch=start_epoch, order=None)

    def on_reset() -> None:
        steps.reshard()
        report.enabled = steps.rank == 0
        unread = None if state.order is None else len(state.order)
        report.emit("elastic", ranks=steps.size, epoch=state.epoch, unread=unread)

    state.register_reset_callbacks([on_reset])
    began = time.perf_counter()

    @steps.run_elastic
    def train(state) -> float:
        test_acc = math.nan
        while state.epoch <= t.epochs:
            epoch, epoch_began = state.epoch, time.perf_counter()

            def commit(unread: Optional[np.ndarray]) -> None:
                state.order = unread
                state.commit()  # raises HostsUpdatedInterrupt when workers changed: reset, then on from here

            stats = steps.train_epoch(epoch, Progress(report, epoch, steps.steps_per_epoch), order=state.order,
                                      commit=commit)
            test_acc = end_epoch(spec, steps, report, epoch, stats, time.perf_counter() - epoch_began)
            state.epoch, state.order = epoch + 1, None
            state.commit()
        return test_acc

    try:
        return finish(spec, steps, report, began, train(state))
    finally:
        report.close()
