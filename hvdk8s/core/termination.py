"""SIGTERM and SIGHUP as an exception in the main thread, as Ctrl-C raises KeyboardInterrupt: a process
that started others (the local launch's mpirun or horovodrun) stops them and removes its files on `kill`,
a closed terminal or a CI runner's timeout, instead of dying and leaving its ranks running."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The process was asked to stop by `signum`; a KeyboardInterrupt, so the cleanup written for Ctrl-C runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal behind `interrupt`: Stopped's, else Ctrl-C's SIGINT."""
    return signal.Signals(getattr(interrupt, "signum", signal.SIGINT))


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for a process ended by the signal behind `interrupt`: 128 + its number."""
    return 128 + signal_of(interrupt)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGHUP raises Stopped; later ones are ignored, so the cleanup
    the first set off is not cut short. Only signals left at their default are taken (under nohup, SIGHUP
    stays ignored); outside the main thread (where Python cannot handle signals) nothing changes; after
    the block, the handlers are as they were."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        for each in SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {each: signal.getsignal(each) for each in SIGNALS}
    for each, handler in previous.items():
        if handler is signal.SIG_DFL:
            signal.signal(each, stop)
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
