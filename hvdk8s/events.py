"""Progress events that rank 0 reports: one line each, either for people or for the local launcher.

Rank 0 prints `@hvdk8s {json}` when HVDK8S_EVENTS=json (set by `hvdk8s launch --local` and by the rendered
MPIJob; `hvdk8s logs` draws them as a local launch does), and plain text otherwise (a hand-run horovodrun).
Any rank's uncaught exception is an event too, "failed", always as JSON (`hvdk8s.failures`).

Ranks' other output (a user's print, a dataset path in an error message) could look like an event; so
a launcher that parses events also sets HVDK8S_EVENTS_TOKEN to a secret of its own, and only lines
prefixed `@hvdk8s:TOKEN ` count. The view never trusts an event's fields either: `parse` takes only a JSON
object whose "event" is a string, and `format_text` falls back to the raw JSON.
"""
from __future__ import annotations

import json
import os
import secrets
import sys
from typing import Any, Callable, Iterable, Optional, TextIO

PREFIX = "@hvdk8s "
TOKEN_ENV = "HVDK8S_EVENTS_TOKEN"
# A "file" event points at what the run wrote besides checkpoints (hvdk8s.runfiles): how to open each.
FILE_HOW = {
    "timeline": "open in chrome://tracing or https://ui.perfetto.dev",
    "autotune": "Horovod's autotuning log, CSV: each setting tried, its score, the best",
    "tensorboard": "view with tensorboard --logdir",
}
Sink = Callable[[dict[str, Any]], None]  # receives each event rank 0 emits (e.g. hvdk8s.tensorboard.Scalars)


def new_token() -> str:
    return secrets.token_hex(8)


def prefix(token: Optional[str] = None) -> str:
    return f"@hvdk8s:{token} " if token else PREFIX


def format_text(event: dict[str, Any]) -> str:
    """A line for people; the event's JSON if its fields are not what its kind promises."""
    try:
        return _format(event)
    except (KeyError, TypeError, ValueError):
        return json.dumps(event)


def _format(event: dict[str, Any]) -> str:
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
    if kind == "elastic":
        left = f", {event['unread']} samples of it left" if event.get("unread") is not None else ""
        return f"elastic: the workers changed; {event['ranks']} ranks from epoch {event['epoch']}{left}"
    if kind == "done":
        return (f"done: test accuracy {event['test_accuracy']:.2%} after {event['epochs']} epochs "
                f"in {event['seconds']:.1f}s (parameters {event['digest']})")
    if kind == "file":
        return f"{event['what']}: {event['path']} ({FILE_HOW[event['what']]})"
    if kind == "failed":  # a rank's uncaught exception (hvdk8s.failures), its traceback follows
        return (f"rank {event['rank']} raised {event['type']}: {event['message']}"
                + (f" ({event['where']})" if event.get("where") else ""))
    return json.dumps(event)


class Reporter:
    """Emits events on rank 0; a no-op on the other ranks. `sinks` get every event emitted too; those
    with a `close()` are closed by `close()`."""

    def __init__(self, enabled: bool, mode: Optional[str] = None, stream: TextIO = sys.stdout,
                 sinks: Iterable[Sink] = ()):
        self.enabled = enabled
        self.mode = mode or os.environ.get("HVDK8S_EVENTS", "text")
        self.prefix = prefix(os.environ.get(TOKEN_ENV))
        self.stream = stream
        self.sinks = list(sinks)

    def emit(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        event = {"event": kind, **fields}
        line = self.prefix + json.dumps(event) if self.mode == "json" else format_text(event)
        # One write per line: mpirun tags every write it forwards, so a separate newline would
        # arrive as its own tagged fragment.
        self.stream.write(line + "\n")
        self.stream.flush()
        for sink in self.sinks:
            sink(event)

    def close(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                close()


def parse(line: str, token: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The event in a line of rank output (launchers may prefix lines with a rank tag), or None.
    With a token, only lines carrying that token's prefix count."""
    mark = prefix(token)
    at = line.find(mark)
    if at < 0:
        return None
    try:  # the first JSON value only: a launcher's tag may follow it on the same line
        event, _ = json.JSONDecoder().raw_decode(line, at + len(mark))
    except (ValueError, RecursionError):  # not JSON, an integer past Python's digit limit, nesting too deep
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None  # a kind to look up
