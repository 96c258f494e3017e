"""A user's dataset factories for the tests that take a job's worker away while it trains: digits, with
rank 0 holding the start of an epoch until what the test does has reached it, so that the order of
events never depends on the machine's speed (without it, a fast machine finishes the job before the
lost worker is back, and a slow one needs ever more epochs).

`digits_held_once` (a job that is not elastic): the first run that reaches `hold_from_epoch` leaves a
marker file and holds until it is killed (the test deletes a worker, which ends that mpirun); the run
that resumes finds the marker and trains to the end.

`digits_held_at_changes` (an elastic job): rank 0 is the process Horovod's driver notifies of host changes (`horovod.common.elastic`'s
notification manager, the channel an elastic `State` listens on). From `hold_from_epoch` on, rank 0
- at 2 or more ranks, until it has been alone once: waits for a host to be *removed*;
- alone (1 rank): waits for a host to be *added* (after it became alone).
The wait is in `epoch_order`, which a loader calls when it plans an epoch, between Horovod's commits, so
no collective is in flight; the other ranks wait in their next allreduce. Once notified, rank 0 plans
the epoch and trains on: its next commit raises HostsUpdatedInterrupt and the job resizes.
"""
from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Callable

from horovod.common.elastic import notification_manager
from horovod.runner.elastic.worker import HostUpdateResult

from hvdk8s.data.datasets import digits, train_test_split


class _HostChanges:
    """The host updates this process was told of (only rank 0's is told)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seen = HostUpdateResult.no_update
        self.alone = False  # rank 0 has trained alone (its process outlives the job's resizes)

    def on_hosts_updated(self, timestamp, update_res) -> None:  # Horovod's listener interface
        with self._cond:
            self._seen |= update_res
            self._cond.notify_all()

    def forget(self, flag: HostUpdateResult) -> None:
        with self._cond:
            self._seen &= ~flag

    def wait_for(self, flag: HostUpdateResult) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._seen & flag)


CHANGES = _HostChanges()
notification_manager.register_listener(CHANGES)


class Held:
    """The digits of `base`; rank 0's plan of each epoch from `hold_from_epoch` on waits for `hold(size)`."""

    def __init__(self, base, hvd, hold_from_epoch: int, hold: Callable[[int], None]):
        self.base, self.info = base, base.info
        self._hvd, self._hold_from, self._hold = hvd, hold_from_epoch, hold

    def __len__(self) -> int:
        return len(self.base)

    def take(self, indices):
        return self.base.take(indices)

    def epoch_order(self, seed: int, epoch: int):
        if epoch >= self._hold_from and self._hvd.rank() == 0:
            self._hold(self._hvd.size())
        return self.base.epoch_order(seed, epoch)


def _until_the_resize(size: int) -> None:
    if size == 1:
        if not CHANGES.alone:  # an addition told before the loss is not the one awaited
            CHANGES.alone = True
            CHANGES.forget(HostUpdateResult.added)
        CHANGES.wait_for(HostUpdateResult.added)
    elif not CHANGES.alone:
        CHANGES.wait_for(HostUpdateResult.removed)


def _once_until_killed(marker: Path) -> Callable[[int], None]:
    def hold(size: int) -> None:
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return  # a run before this one held: train on
        threading.Event().wait()  # until the test's deleted worker ends this run
    return hold


def _split(framework: str, hold_from_epoch: int, test_fraction: float, hold: Callable[[int], None]) -> dict:
    hvd = importlib.import_module({"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow"}[framework])
    train, test = train_test_split(digits(), test_fraction)
    return {"train": Held(train, hvd, hold_from_epoch, hold), "test": test}


def digits_held_at_changes(framework: str = "pytorch", hold_from_epoch: int = 3, test_fraction: float = 0.2):
    return _split(framework, hold_from_epoch, test_fraction, _until_the_resize)


def digits_held_once(marker: str, framework: str = "pytorch", hold_from_epoch: int = 3,
                     test_fraction: float = 0.2):
    return _split(framework, hold_from_epoch, test_fraction, _once_until_killed(Path(marker)))
