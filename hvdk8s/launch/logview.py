"""A cluster job's log drawn like a local launch: rank 0's events through the same progress view.

A launcher pod's log carries rank 0's events in one of two forms, and both are read:
* `@hvdk8s {json}` lines (HVDK8S_EVENTS=json, what a local launch asks for);
* the plain text lines that `events.format_text` writes (HVDK8S_EVENTS=text, what a rendered MPIJob
  sets today so that `kubectl logs` stays readable), recognised by their exact shapes below.

Cluster ranks print no token (they have no launcher process of ours to share one with), so here the
view's caution is what guards it: a user's line that happens to look like an event is drawn as the very
same text.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Optional

from hvdk8s import events, failures, logformat
from hvdk8s.launch.progress import ProgressView

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"
_INT = r"\d+"


def _shape(pattern: str, **kinds: Callable[[str], Any]) -> tuple[re.Pattern, dict]:
    return re.compile("^" + pattern + "$"), kinds


def _pct(text: str) -> float:
    return float(text) / 100


# One pattern per event kind, mirroring `events._format` field for field.
_TEXT_SHAPES: dict[str, tuple[re.Pattern, dict]] = {
    "start": _shape(rf"job (?P<job>\S+): (?P<framework>\S+) (?P<model>.+?) on (?P<dataset>.+?), (?P<ranks>{_INT}) "
                    rf"ranks, compression (?P<compression>\S+), (?:precision (?P<precision>\S+), )?"
                    rf"lr (?P<lr>{_NUM}), (?P<steps_per_epoch>{_INT}) steps/epoch",
                    ranks=int, lr=float, steps_per_epoch=int),
    "resume": _shape(rf"resumed from (?P<path>.+) \(epoch (?P<epoch>{_INT}), parameters (?P<digest>\w+)\)", epoch=int),
    "progress": _shape(rf"epoch (?P<epoch>{_INT}) step (?P<step>{_INT})/(?P<steps>{_INT}) loss (?P<loss>{_NUM}) "
                       rf"(?P<samples_per_s>{_NUM}) samples/s",
                       epoch=int, step=int, steps=int, loss=float, samples_per_s=float),
    "epoch": _shape(rf"epoch (?P<epoch>{_INT})/(?P<epochs>{_INT})  loss (?P<loss>{_NUM})  acc (?P<accuracy>{_NUM})%  "
                    rf"test loss (?P<test_loss>{_NUM})  test acc (?P<test_accuracy>{_NUM})%  "
                    rf"(?P<samples_per_s>{_NUM}) samples/s  (?P<seconds>{_NUM})s(?:  loss scale (?P<loss_scale>{_NUM}))?",
                    epoch=int, epochs=int, loss=float, accuracy=_pct, test_loss=float, test_accuracy=_pct,
                    samples_per_s=float, seconds=float, loss_scale=float),
    "checkpoint": _shape(r"checkpoint (?P<path>\S.*)"),
    "elastic": _shape(rf"elastic: the workers changed; (?P<ranks>{_INT}) ranks from epoch (?P<epoch>{_INT})"
                      rf"(?:, (?P<unread>{_INT}) samples of it left)?", ranks=int, epoch=int, unread=int),
    "done": _shape(rf"done: test accuracy (?P<test_accuracy>{_NUM})% after (?P<epochs>{_INT}) epochs in "
                   rf"(?P<seconds>{_NUM})s \(parameters (?P<digest>\w+)\)",
                   test_accuracy=_pct, epochs=int, seconds=float),
    "file": _shape(rf"(?P<what>{'|'.join(events.FILE_HOW)}): (?P<path>\S.*) "
                   rf"\((?:{'|'.join(map(re.escape, events.FILE_HOW.values()))})\)"),
}


# mpirun --tag-output (and horovodrun) put the rank in front of its lines: `[1,0]<stdout>:`, `[0]<stdout>:`.
_RANK_TAG = logformat.RANK_TAG


def text_event(line: str) -> Optional[dict[str, Any]]:
    """The event a plain-text event line stands for, or None."""
    line = _RANK_TAG.sub("", line.rstrip("\r\n"), count=1)
    for kind, (pattern, kinds) in _TEXT_SHAPES.items():
        m = pattern.match(line)
        if m:
            fields = {k: kinds.get(k, str)(v) for k, v in m.groupdict().items() if v is not None}
            return {"event": kind, **fields}
    return None


def event_of(line: str) -> Optional[dict[str, Any]]:
    """Rank 0's event in a log line, in either form; None for any other output."""
    return events.parse(line) or text_event(line)


def show(lines: Iterable[str], console) -> Optional[failures.Failure]:
    """Draw a log: events through the local launch's progress view, every other line as it is."""
    return draw(lines, ProgressView(console))


def first_failure(lines: Iterable[str]) -> Optional[failures.Failure]:
    """The rank that failed first, as a log says it (nothing is drawn)."""
    first = failures.FirstFailure()
    for line in lines:
        first.feed(line, event_of(line))
    return first.first()


def draw(lines: Iterable[str], view) -> Optional[failures.Failure]:
    """Each line of a log to `view`: rank 0's events to `show`, every other line to `passthrough`
    (the progress view, or `hvdk8s.logformat.JsonLog`). Returns the rank that failed first, if any did."""
    first = failures.FirstFailure()
    try:
        for line in lines:
            event = event_of(line)
            first.feed(line, event)
            if event is None:
                view.passthrough(line.rstrip("\r\n"))
            else:
                view.show(event)
    finally:
        view.close()
    return first.first()
