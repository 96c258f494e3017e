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


class HeldAtChanges:
    def __init__(self, base, hvd, hold_from_epoch: int):
        self.base, self.info = base, base.info
        self._hvd, self._hold_from = hvd, hold_from_epoch

    def __len__(self) -> int:
        return len(self.base)

    def take(self, indices):
        return self.base.take(indices)

    def epoch_order(self, seed: int, epoch: int):
        if epoch >= self._hold_from and self._hvd.rank() == 0:
            if self._hvd.size() == 1:
                if not CHANGES.alone:  # an addition told before the loss is not the one awaited
                    CHANGES.alone = True
                    CHANGES.forget(HostUpdateResult.added)
                CHANGES.wait_for(HostUpdateResult.added)
            elif not CHANGES.alone:
                CHANGES.wait_for(HostUpdateResult.removed)
        return self.base.epoch_order(seed, epoch)


def _horovod(framework: str):
    return importlib.import_module({"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow"}[framework])


def digits_held_at_changes(framework: str = "pytorch", hold_from_epoch: int = 3, test_fraction: float = 0.2):
    train, test = train_test_split(digits(), test_fraction)
    return {"train": HeldAtChanges(train, _horovod(framework), hold_from_epoch), "test": test}


class HeldOnce:
    def __init__(self, base, hvd, hold_from_epoch: int, marker: Path):
        self.base, self.info = base, base.info
        self._hvd, self._hold_from, self._marker = hvd, hold_from_epoch, marker

    def __len__(self) -> int:
        return len(self.base)

    def take(self, indices):
        return self.base.take(indices)

    def epoch_order(self, seed: int, epoch: int):
        if epoch >= self._hold_from and self._hvd.rank() == 0:
            try:
                self._marker.touch(exist_ok=False)
            except FileExistsError:
                pass  # a run before this one held: train on
            else:
                threading.Event().wait()  # until the test's deleted worker ends this run
        return self.base.epoch_order(seed, epoch)


def digits_held_once(marker: str, framework: str = "pytorch", hold_from_epoch: int = 3,
                     test_fraction: float = 0.2):
    train, test = train_test_split(digits(), test_fraction)
    return {"train": HeldOnce(train, _horovod(framework), hold_from_epoch, Path(marker)), "test": test}
