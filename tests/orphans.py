"""How a killed launcher's ranks ended, read from their exit status rather than from a clock.

While `adopting()` is in force this test process is a child subreaper (Linux prctl): the ranks, orphaned when
their launcher (and mpirun) die, become its children, so `ends` can wait for each one and say what ended
it. A rank that died with its parent shows SIGKILL (`hvdk8s._adapter.die_with_parent`); one that trained on
until it next wrote to its closed output shows an exit code or SIGPIPE, however fast or slow the machine.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36


def _subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


@contextlib.contextmanager
def adopting():
    """Orphans of this process's descendants become its children within the block; on leaving it, any
    that ended are reaped (their exit statuses are no one else's)."""
    _subreaper(True)
    try:
        yield
    finally:
        _subreaper(False)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return f"exit {os.WEXITSTATUS(status)}"


def ends(pids, watchdog: float = 120.0) -> dict[int, str]:
    """{pid: 'SIGKILL' | 'exit N' | ...} for adopted processes, once each has ended. The watchdog only stops a
    test whose processes never end (a rank that neither died with its parent nor stopped on its own)."""
    pending, found = set(pids), {}
    deadline = time.monotonic() + watchdog
    while pending:
        for pid in list(pending):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (yet): its parent lives, or ended it and reaped it
                if not os.path.exists(f"/proc/{pid}"):
                    found[pid] = "reaped by its parent"
                    pending.discard(pid)
                continue
            if done:
                found[pid] = how_it_ended(status)
                pending.discard(pid)
        assert time.monotonic() < deadline, f"still running after {watchdog} s: {sorted(pending)}"
        if pending:
            time.sleep(0.01)
    return found


def gone(members, session: int, watchdog: float = 60.0) -> list[int]:
    """Wait until `members(session)` (the session's live processes) is empty; what is left at the watchdog."""
    deadline = time.monotonic() + watchdog
    while (left := members(session)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left
