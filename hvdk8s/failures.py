"""Which rank failed first, and with what: the one line a failed job ends with, locally and in `hvdk8s logs`.

When one rank raises, Horovod's shutdown makes the others fail too (HorovodInternalError, "Horovod has been
shut down"), and mpirun names whichever rank exited first: often a rank that only failed as a consequence.
So each rank records its own failure as it happens: `report_uncaught` makes an uncaught exception write a
"failed" event (type, message, where in the user's code, wall-clock and monotonic time) before the
interpreter's exit handlers run Horovod's shutdown, which is what tells the other ranks. `FirstFailure`
reads a job's output (the launcher's, which carries every rank's, tagged by mpirun) and decides; where a
rank left no event (a script run without hvdk8s's rank entry), its Python traceback stands in.

The event is JSON whatever HVDK8S_EVENTS says: its reader needs the fields and times, and it is one line
per failed rank, once.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from hvdk8s import events
from hvdk8s.logformat import split_tag

KIND = "failed"
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMIX_RANK")  # mpirun; horovodrun --gloo; PMIx
# Errors a rank gets because another rank failed first: Horovod shut down under it, or a peer went away.
_SECONDARY_TYPES = ("HorovodInternalError",)
_SECONDARY_MESSAGES = ("Horovod has been shut down", "Connection closed by peer", "Connection reset by peer",
                       "MPI_ABORT")
# Frames of Python itself and of installed packages (on the ranks' machine, which need not be this one).
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "<string>")
_HVDK8S_MARK = "/hvdk8s/"  # hvdk8s's own frames, from a source checkout (installed, they are a library's)
_MAX_MESSAGE = 300

# Tiers: an error of the rank's own beats the death of a rank by a signal, which beats a consequence.
OWN, SIGNAL, CONSEQUENCE = 0, 1, 2


def is_secondary(kind: str, message: str) -> bool:
    """Whether an exception of type `kind` (dotted or not) with `message` is a consequence of another
    rank's failure rather than a failure of its own."""
    return kind.rsplit(".", 1)[-1] in _SECONDARY_TYPES or any(m in message for m in _SECONDARY_MESSAGES)


def user_frame(frames: list[tuple[str, int]]) -> Optional[str]:
    """`file.py:LINE` of the innermost of `frames` (outermost first) in the user's code: not Python's or an
    installed package's, and not hvdk8s's where the user's own code called it; else the innermost frame
    that is not a library's, else the innermost."""
    def where(frame: tuple[str, int]) -> str:
        return f"{os.path.basename(frame[0])}:{frame[1]}"

    own = [f for f in frames if not any(m in f[0] for m in _LIBRARY_MARKS)]
    users = [f for f in own if _HVDK8S_MARK not in f[0]]
    chosen = (users or own or frames)[-1:]
    return where(chosen[0]) if chosen else None


def _first_line(text: str) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= _MAX_MESSAGE else line[:_MAX_MESSAGE - 3] + "..."


def event_of(error: BaseException) -> dict[str, Any]:
    """The "failed" event of this rank for `error`."""
    import traceback

    frames = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(error.__traceback__)]
    rank = next((os.environ[v] for v in _RANK_VARIABLES if os.environ.get(v, "").isdigit()), None)
    return {"event": KIND, "rank": None if rank is None else int(rank), "type": type(error).__name__,
            "message": _first_line(str(error)), "where": user_frame(frames), "time": time.time(),
            "monotonic": time.monotonic(), "host": socket.gethostname()}


def report_uncaught() -> None:
    """From here on, an uncaught exception writes this rank's "failed" event on stderr, then its
    traceback as before. KeyboardInterrupt and the like are no failure of the rank's own: left alone."""
    previous = sys.excepthook

    def hook(kind, error, tb):
        if issubclass(kind, Exception):
            try:
                line = events.prefix(os.environ.get(events.TOKEN_ENV)) + json.dumps(event_of(error))
                sys.stderr.write(line + "\n")  # one write: mpirun tags each write it forwards
                sys.stderr.flush()
            except Exception:  # the traceback below still says what happened
                pass
        previous(kind, error, tb)

    sys.excepthook = hook


@dataclass(frozen=True)
class Failure:
    rank: int
    kind: str  # the exception's type, or how the rank died
    message: str
    where: Optional[str]
    tier: int
    order: int  # the line of the output that made it known
    time: Optional[float] = None  # from a rank's event only
    monotonic: Optional[float] = None
    host: Optional[str] = None

    def summary(self) -> str:
        """The line a failed job ends with."""
        what = f"{self.kind}: {self.message}" if self.message else self.kind
        what += f" ({self.where})" if self.where else ""
        if self.tier == CONSEQUENCE:  # the rank that failed first left no word of its own
            return f"no rank reported an error of its own; rank {self.rank} reported first: {what}"
        return f"rank {self.rank} failed first: {what}"


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")
# How a launcher says a rank died without a Python error: mpirun "mpirun noticed that process rank 1 with PID
# 123 on node x exited on signal 9 (Killed).", horovodrun "Process 1 exit with status code 137."
_SIGNALLED = re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node \S+ exited on signal (?P<signal>\d+)")
_EXITED = re.compile(r"^Process (?P<rank>\d+) exit with status code (?P<code>\d+)\.")


class FirstFailure:
    """Reads a job's output line by line (`feed`) and names the rank that failed first (`first`)."""

    def __init__(self):
        self.seen = 0
        self.by_rank: dict[int, Failure] = {}  # a rank's own event, else its latest traceback, else its signal
        self._frames: dict[tuple[int, str], list[tuple[str, int]]] = {}  # tracebacks being read, per rank and stream

    def feed(self, line: str, event: Optional[dict[str, Any]] = None) -> None:
        """One line of output; `event` is the event the caller parsed from it (with the launcher's token
        where there is one), or None."""
        self.seen += 1
        rank, stream, body = split_tag(line.rstrip("\r\n"))
        if event is not None and event.get("event") == KIND:
            self._event(event, event.get("rank") if rank is None else rank)
        elif rank is not None:
            self._traceback_line(rank, stream, body)
        else:
            self._launcher_line(body)

    def _event(self, event: dict[str, Any], rank: Any) -> None:
        try:
            kind, message = str(event["type"]), str(event.get("message") or "")
            where = event.get("where")
            self.by_rank[int(rank)] = Failure(
                int(rank), kind, message, str(where) if where else None,
                CONSEQUENCE if is_secondary(kind, message) else OWN, self.seen,
                _number(event.get("time")), _number(event.get("monotonic")), str(event.get("host") or "") or None)
        except (KeyError, TypeError, ValueError):  # an event without the fields it promises: not evidence
            pass

    def _traceback_line(self, rank: int, stream: str, body: str) -> None:
        key = (rank, stream)
        if body.startswith("Traceback (most recent call last):"):
            self._frames[key] = []
            return
        frames = self._frames.get(key)
        if frames is None:
            return
        frame = _FRAME.match(body)
        if frame:
            frames.append((frame["file"], int(frame["line"])))
            return
        if body.startswith((" ", "\t")):
            return  # a frame's source line, or its ^^^^ markers
        del self._frames[key]
        m = _EXCEPTION.match(body)
        known = self.by_rank.get(rank)
        if m and (known is None or known.time is None):  # a rank's own event says it better
            kind, message = m["type"].rsplit(".", 1)[-1], _first_line(m["message"] or "")
            self.by_rank[rank] = Failure(rank, kind, message, user_frame(frames),
                                         CONSEQUENCE if is_secondary(kind, message) else OWN, self.seen)

    def _launcher_line(self, line: str) -> None:
        signalled, exited = _SIGNALLED.search(line), _EXITED.match(line)
        m = signalled or exited
        if m is None or int(m["rank"]) in self.by_rank:  # a rank's own word on its end says more
            return
        code = int(exited["code"]) if exited else 128 + int(signalled["signal"])
        if code == 0:
            return
        if 128 < code < 128 + signal.NSIG:
            name = signal.strsignal(code - 128)
            kind = f"killed by signal {code - 128}" + (f" ({name})" if name else "")
        else:
            kind = f"exited with status {code}"
        # SIGTERM is how launchers stop the remaining ranks once one has failed
        tier = CONSEQUENCE if code == 128 + signal.SIGTERM else SIGNAL
        self.by_rank[int(m["rank"])] = Failure(int(m["rank"]), kind, "", None, tier, self.seen)

    def first(self) -> Optional[Failure]:
        """The failure that came first among those of the best tier: by the ranks' monotonic clocks when
        all of them ran on one host, by their wall clocks when each left an event, else by output order."""
        if not self.by_rank:
            return None
        tier = min(f.tier for f in self.by_rank.values())
        pool = [f for f in self.by_rank.values() if f.tier == tier]
        if all(f.monotonic is not None for f in pool) and len({f.host for f in pool}) == 1:
            return min(pool, key=lambda f: f.monotonic)
        if all(f.time is not None for f in pool):
            return min(pool, key=lambda f: f.time)
        return min(pool, key=lambda f: f.order)


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
