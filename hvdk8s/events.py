"""Progress events that rank 0 reports: one line each, either for people or for the local launcher.

Rank 0 prints `@hvdk8s {json}` when HVDK8S_EVENTS=json (set by `hvdk8s launch --local`, which parses
them and draws progress), and plain text otherwise (logs of a cluster pod, a hand-run horovodrun).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional, TextIO

PREFIX = "@hvdk8s "


def format_text(event: dict[str, Any]) -> str:
    kind = event.get("event")
    if kind == "start":
        precision = event.get("precision", "fp32")
        return (f"job {event['job']}: {event['framework']} {event['model']} on {event['dataset']}, "
                f"{event['ranks']} ranks, compression {event['compression']}, "
                + (f"precision {precision}, " if precision != "fp32" else "")
                + f"lr {event['lr']:.4g}, {event['steps_per_epoch']} steps/epoch")
    if kind == "resume":
        return f"resumed from {event['path']} (epoch {event['epoch']}, parameters {event['digest']})"
    if kind == "progress":
        return (f"epoch {event['epoch']} step {event['step']}/{event['steps']} loss {event['loss']:.4f} "
                f"{event['samples_per_s']:.0f} samples/s")
    if kind == "epoch":
        return (f"epoch {event['epoch']}/{event['epochs']}  loss {event['loss']:.4f}  acc {event['accuracy']:.2%}  "
                f"test loss {event['test_loss']:.4f}  test acc {event['test_accuracy']:.2%}  "
                f"{event['samples_per_s']:.0f} samples/s  {event['seconds']:.2f}s"
                + (f"  loss scale {event['loss_scale']:g}" if event.get("loss_scale") is not None else ""))
    if kind == "checkpoint":
        return f"checkpoint {event['path']}"
    if kind == "done":
        return (f"done: test accuracy {event['test_accuracy']:.2%} after {event['epochs']} epochs "
                f"in {event['seconds']:.1f}s (parameters {event['digest']})")
    return json.dumps(event)


class Reporter:
    """Emits events on rank 0; a no-op on the other ranks."""

    def __init__(self, enabled: bool, mode: Optional[str] = None, stream: TextIO = sys.stdout):
        self.enabled = enabled
        self.mode = mode or os.environ.get("HVDK8S_EVENTS", "text")
        self.stream = stream

    def emit(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        event = {"event": kind, **fields}
        line = PREFIX + json.dumps(event) if self.mode == "json" else format_text(event)
        # One write per line: mpirun tags every write it forwards, so a separate newline would
        # arrive as its own tagged fragment.
        self.stream.write(line + "\n")
        self.stream.flush()


def parse(line: str) -> Optional[dict[str, Any]]:
    """The event in a line of rank output (launchers may prefix lines with a rank tag), or None."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:  # the first JSON value only: a launcher's tag may follow it on the same line
        event, _ = json.JSONDecoder().raw_decode(line, at + len(PREFIX))
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None
