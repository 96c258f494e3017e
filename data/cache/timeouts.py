"""How long a sync waits on a remote source that stops answering.

Two bounds, in seconds: `io_timeout`, the longest one connect or one read may wait (a stalled attempt
then fails and may be retried), and `stall_timeout`, the longest one file may go without receiving a
byte, summed over all its attempts: once spent, the file fails, naming its URL, however many retries
were allowed. Each attempt waits at most what is left of it, so a dead server fails a file after
`stall_timeout` seconds. The command line reads them from the environment.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .errors import CacheError

IO_TIMEOUT = 15.0
STALL_TIMEOUT = 45.0
IO_ENV = "HVDK8S_CACHE_IO_TIMEOUT"
STALL_ENV = "HVDK8S_CACHE_STALL_TIMEOUT"


@dataclass(frozen=True)
class Timeouts:
    io: float
    stall: float


def resolve(io_timeout: float | None, stall_timeout: float | None) -> Timeouts:
    """The given bounds, else the environment's, else the defaults; each must be a positive number."""
    io = _pick("io_timeout", io_timeout, IO_ENV, IO_TIMEOUT)
    return Timeouts(io=io, stall=_pick("stall_timeout", stall_timeout, STALL_ENV, STALL_TIMEOUT))


def _pick(name: str, given: float | None, env: str, default: float) -> float:
    where = name
    if given is None:
        raw = os.environ.get(env)
        if not raw:
            return default
        where = f"${env}"
        try:
            given = float(raw)
        except ValueError:
            raise CacheError(f"{where} must be a number of seconds, got {raw!r}") from None
    if not (isinstance(given, (int, float)) and math.isfinite(given) and given > 0):
        raise CacheError(f"{where} must be a positive number of seconds (a timeout), got {given!r}")
    return float(given)
