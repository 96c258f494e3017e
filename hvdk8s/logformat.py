"""`--log-format json`: a job's events and its ranks' other output as one JSON object per line, for log stacks.

The one place that turns what a launcher reads into a log record, for a local launch and a cluster log
alike. Every record has `time` (RFC 3339, UTC, milliseconds), `level`, `job` and `event`: rank 0's event
kind with its fields, `output` for any other line (with `rank` where mpirun's tag names it, and the line
as `message`), and `exit` last, with how the job ended.

The text is the ranks', so it may hold anything: `json.dumps` escapes quotes and control characters, and
writes ASCII only, so no character a reader counts as a line break (U+2028, U+0085) survives unescaped;
lone surrogates become U+FFFD and non-finite numbers null, which strict JSON parsers refuse.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import sys
from typing import Any, Optional, TextIO

from hvdk8s.events import PREFIX

FORMATS = ("text", "json")
DEFAULT_FORMAT = "text"

# mpirun --tag-output puts `[JOBID,RANK]<stdout>:` in front of each line, horovodrun (Gloo) `[RANK]<stderr>:`.
RANK_TAG = re.compile(r"^\[(?:\d+,)?(?P<rank>\d+)\]<(?P<stream>stdout|stderr)>:")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BASE = ("time", "level", "job", "event")
_OWN_KINDS = ("output", "exit")  # the log's own records: a rank's event of such a kind is logged as output


def split_tag(line: str) -> tuple[Optional[int], Optional[str], str]:
    """(rank, stream, the line as the rank printed it) of a line mpirun or horovodrun tagged; (None,
    None, line) of any other. mpirun tags each piece it reads from a rank, not each line, so a line the
    rank wrote in several writes (Python's traceback writes an exception's type and message apart when
    stderr is unbuffered) can carry the same tag again inside it: `[1,1]<stderr>:RuntimeError[1,1]<stderr>::
    boom`. Those repeats go."""
    tag = RANK_TAG.match(line)
    if not tag:
        return None, None, line
    return int(tag["rank"]), tag["stream"], line[tag.end():].replace(tag[0], "")


def timestamp(moment: Optional[dt.datetime] = None) -> str:
    """RFC 3339 in UTC with milliseconds: 2024-05-01T12:00:00.123Z."""
    moment = (moment or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(job: str, kind: str, level: str = "info", fields: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A record of `kind` with `fields` after the fixed keys, which a field never overrides (an event's
    own fields cannot relabel its record)."""
    return {"time": timestamp(), "level": level, "job": job, "event": kind,
            **{k: v for k, v in (fields or {}).items() if k not in _BASE}}


def event_record(job: str, event: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's event as a record."""
    return record(job, str(event["event"]), fields=event)


def exit_record(job: str, code: int, status: str, message: str = "") -> dict[str, Any]:
    """The job's end: the exit code hvdk8s exits with, and the phase (Succeeded, Failed)."""
    return record(job, "exit", "info" if code == 0 else "error",
                  {"code": code, "status": status, **({"message": message} if message else {})})


def dumps(record: dict[str, Any]) -> str:
    """One line of strict JSON, whatever the record holds."""
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:  # NaN or infinity somewhere in an event's fields: null, by a round trip through JSON
        return json.dumps(json.loads(json.dumps(record), parse_constant=lambda _: None), allow_nan=False)
    except RecursionError:  # fields nested deeper than the encoder goes: keep what the record is
        return json.dumps({**{k: record[k] for k in _BASE}, "message": "fields nested too deep to log"})


class _Tracebacks:
    """Which lines belong to a Python traceback: its header, its indented frames and the exception line
    that closes it are errors. Followed per rank and stream, since tagged lines of several interleave."""

    def __init__(self):
        self.inside: set[tuple[Optional[int], Optional[str]]] = set()

    def level(self, rank: Optional[int], stream: Optional[str], body: str) -> str:
        if body.startswith("Traceback (most recent call last):"):
            self.inside.add((rank, stream))
            return "error"
        if (rank, stream) in self.inside:
            if not body.startswith((" ", "\t")):
                self.inside.discard((rank, stream))  # the exception line
            return "error"
        return "warning" if stream == "stderr" else "info"  # stderr is where diagnostics go


class JsonLog:
    """Writes records to `stream`, one line each; has the progress view's methods (`show` an event,
    `passthrough` a line, `close`), so that a launcher draws or logs through the same code."""

    def __init__(self, job: str, stream: Optional[TextIO] = None):
        self.job = job
        self.stream = stream or sys.stdout
        self.tracebacks = _Tracebacks()

    def write(self, record: dict[str, Any]) -> None:
        self.stream.write(dumps(record) + "\n")
        self.stream.flush()  # live through pipes: a log shipper reads as the job runs

    def show(self, event: dict[str, Any]) -> None:
        if event["event"] in _OWN_KINDS:  # a script printing `@hvdk8s {"event": "exit"}` cannot end the job's log
            self.passthrough(PREFIX + dumps(event))
        else:
            self.write(event_record(self.job, event))

    def passthrough(self, line: str) -> None:
        self.write(self.output(line))

    def output(self, line: str, level: Optional[str] = None) -> dict[str, Any]:
        """A line of the ranks' (or their launcher's) output as a record."""
        line = _SURROGATE.sub("\ufffd", line.rstrip("\r\n"))
        rank, stream, body = split_tag(line)
        level = level or self.tracebacks.level(rank, stream, body)
        return record(self.job, "output", level, {**({"rank": rank} if rank is not None else {}), "message": body})

    def fail(self, message: str) -> None:
        """hvdk8s's own error about the job (a hung rank stopped)."""
        self.write(self.output(message, level="error"))

    def exit(self, code: int, status: str, message: str = "") -> None:
        self.write(exit_record(self.job, code, status, message))

    def close(self) -> None:
        pass
