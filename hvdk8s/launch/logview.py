"""A cluster job's log drawn like a local launch: rank 0's events through the same progress view.

A launcher pod's log carries rank 0's events as `@hvdk8s {json}` lines (the rendered MPIJob sets
HVDK8S_EVENTS=json, as a local launch does): the one form every reader takes (this view, `--log-format
json`, the tests). Every other line, a hand-run job's text progress included, is shown as it is.

Cluster ranks print no token (they have no launcher process of ours to share one with), so here the
view's caution is what guards it: a user's line that happens to look like an event is drawn as the very
same text.
"""
from __future__ import annotations

from typing import Iterable, Optional

from hvdk8s import events, failures
from hvdk8s.launch.progress import ProgressView


def show(lines: Iterable[str], console) -> Optional[failures.Failure]:
    """Draw a log: events through the local launch's progress view, every other line as it is."""
    return draw(lines, ProgressView(console))


def first_failure(lines: Iterable[str]) -> Optional[failures.Failure]:
    """The rank that failed first, as a log says it (nothing is drawn)."""
    first = failures.FirstFailure()
    for line in lines:
        first.feed(line, events.parse(line))
    return first.first()


def draw(lines: Iterable[str], view) -> Optional[failures.Failure]:
    """Each line of a log to `view`: rank 0's events to `show`, every other line to `passthrough`
    (the progress view, or `hvdk8s.logformat.JsonLog`). Returns the rank that failed first, if any did."""
    first = failures.FirstFailure()
    try:
        for line in lines:
            event = events.parse(line)  # behind a rank tag too
            first.feed(line, event)
            if event is None:
                view.passthrough(line.rstrip("\r\n"))
            else:
                view.show(event)
    finally:
        view.close()
    return first.first()
