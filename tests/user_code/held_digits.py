"""A user's dataset factories for the tests that take a job's worker away while it trains: digits, with
rank 0 holding the start of an epoch until what the test does has reached it, so that the order of
events never depends on the machine's speed (without it, a fast machine finishes the job before the
lost worker is back, and a slow one needs ever more epochs).

`digits_held_once` (a job that is not elastic): the first run that reaches `hold_from_epoch` leaves a
marker file and holds until it is killed (the test deletes a worker, which ends that mpirun); the run
that resumes finds the marker and trains to the end.

`digits_held_at_changes` (an elastic job): rank 0 is the process Horovod's driver notifies of host changes
(`horovod.common.elastic`'s notification manager, the channel an elastic `State` listens on; only the
job's current rank 0 is told). From `hold_from_epoch` on, rank 0
- at 2 or more ranks, until the job has been alone once: waits for a host to be *removed*;
- alone (1 rank): waits for a host to be *added* (`_HostChanges` says which additions count).
The wait is in `epoch_order`, which a loader calls when it plans an epoch, between Horovod's commits, so
no collective is in flight; the other ranks wait in their next allreduce. Once notified, rank 0 plans
the epoch and trains on: its next commit raises HostsUpdatedInterrupt and the job resizes.
"""
from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Callable

from horovod.common.basics import HorovodBasics
from horovod.common.elastic import notification_manager
from horovod.runner.elastic.worker import HostUpdateResult

from hvdk8s.data.datasets import digits, train_test_split


class _HostChanges:
    """What this process was told of host changes (Horovod tells only the job's current rank 0, so a
    process that was rank 1 when a host went was told nothing of it) and how it held.

    - At 2 or more ranks, rank 0 holds until a host is removed, unless this process has trained alone
      before (the job has lost its worker and got it back). Additions told until then are stale.
    - Alone (1 rank), rank 0 holds until an addition newer than those: counted from when it is told,
      not from when rank 0 next plans an epoch (the lost worker's pod can be back while rank 0 is still
      resetting to 1 rank, and Horovod tells it once). One addition per world of ranks: an addition told
      while the host was in horovodrun's blacklist cooldown resizes the job to 1 rank again, and the
      host's return after the cooldown is told as another."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.removed = False
        self.additions = 0  # additions told so far
        self.stale = 0  # additions up to this count do not end a hold at 1 rank
        self.been_alone = False
        self.taken_in_world = -1

    def on_hosts_updated(self, timestamp, update_res) -> None:  # Horovod's listener interface
        with self._cond:
            self.removed |= bool(update_res & HostUpdateResult.removed)
            self.additions += bool(update_res & HostUpdateResult.added)
            self._cond.notify_all()

    def hold_among_others(self) -> None:
        with self._cond:
            if not self.been_alone:
                self._cond.wait_for(lambda: self.removed)
            self.stale = self.additions

    def hold_alone(self) -> None:
        with self._cond:
            self.been_alone = True
            if self.taken_in_world == WORLDS.count:  # a call at a commit, in the world that took one
                return
            self._cond.wait_for(lambda: self.additions > self.stale)
            self.stale, self.taken_in_world = self.additions, WORLDS.count


class _Worlds:
    """How many times this process has started Horovod: an elastic job inits again at each change of its
    ranks (horovod.torch.elastic's and horovod.tensorflow.elastic's reset), so this counts its worlds."""

    def __init__(self) -> None:
        self.count = 0
        started = HorovodBasics.init

        def init(basics, *args, **kwargs):
            self.count += 1
            return started(basics, *args, **kwargs)

        HorovodBasics.init = init


WORLDS = _Worlds()
CHANGES = _HostChanges()
notification_manager.register_listener(CHANGES)


class Held:
    """The digits of `base`; rank 0's plan of each epoch from `hold_from_epoch` on waits for `hold(size)`."""

    def __init__(self, base, horovod_module: str, hold_from_epoch: int, hold: Callable[[int], None]):
        self.base, self.info = base, base.info
        self._horovod, self._hold_from, self._hold = horovod_module, hold_from_epoch, hold

    def __len__(self) -> int:
        return len(self.base)

    def take(self, indices):
        return self.base.take(indices)

    def epoch_order(self, seed: int, epoch: int):
        if epoch >= self._hold_from:
            # Imported here, in a rank: `hvdk8s launch` calls the factory to check its result, and importing
            # the framework there cost the launcher 7-10 CPU-s (TensorFlow) for nothing.
            hvd = importlib.import_module(self._horovod)
            if hvd.rank() == 0:
                self._hold(hvd.size())
        return self.base.epoch_order(seed, epoch)


def _until_the_resize(size: int) -> None:
    if size == 1:
        CHANGES.hold_alone()
    else:
        CHANGES.hold_among_others()


def _once_until_killed(marker: Path) -> Callable[[int], None]:
    def hold(size: int) -> None:
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return  # a run before this one held: train on
        threading.Event().wait()  # until the test's deleted worker ends this run
    return hold


def _split(framework: str, hold_from_epoch: int, test_fraction: float, hold: Callable[[int], None]) -> dict:
    horovod_module = {"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow"}[framework]
    train, test = train_test_split(digits(), test_fraction)
    return {"train": Held(train, horovod_module, hold_from_epoch, hold), "test": test}


def digits_held_at_changes(framework: str = "pytorch", hold_from_epoch: int = 3, test_fraction: float = 0.2):
    return _split(framework, hold_from_epoch, test_fraction, _until_the_resize)


def digits_held_once(marker: str, framework: str = "pytorch", hold_from_epoch: int = 3,
                     test_fraction: float = 0.2):
    return _split(framework, hold_from_epoch, test_fraction, _once_until_killed(Path(marker)))
