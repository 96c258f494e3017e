"""Rank 0's scalars for TensorBoard (`observability.tensorboard`), written from the events it reports: a
sink of `hvdk8s.events.Reporter`, so both frameworks write the same tags from the same figures.

Per epoch (step: the epoch): loss, accuracy, test loss, test accuracy, learning rate, samples/s. At each
progress report (step: the global training step): loss and samples/s.

Written with the `tensorboard` package's record writer and protos, not its `EventFileWriter`: that one
opens files through `tf.io.gfile`, which imports TensorFlow when it is installed (seconds, and a second
framework inside a PyTorch rank). Each run (a resume too) adds a new event file to the directory; TensorBoard
reads them as one run.
"""
from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

from hvdk8s.core.errors import UserError

# event kind -> {event field: tag}
TAGS: dict[str, dict[str, str]] = {
    "epoch": {"loss": "epoch/loss", "accuracy": "epoch/accuracy", "test_loss": "epoch/test_loss",
              "test_accuracy": "epoch/test_accuracy", "lr": "epoch/learning_rate",
              "samples_per_s": "epoch/samples_per_s"},
    "progress": {"loss": "step/loss", "samples_per_s": "step/samples_per_s"},
}
_FILES = itertools.count()  # part of each file's name, as in TensorBoard's own: two writers never share one


def _protos():
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        raise UserError("observability.tensorboard needs the tensorboard package "
                        "(pip install 'hvdk8s[observe]')") from None
    return Event, Summary, RecordWriter


def step_of(event: dict[str, Any]) -> int:
    """The x axis: epochs for an epoch's figures, global training steps for progress reports."""
    if event["event"] == "epoch":
        return int(event["epoch"])
    return (int(event["epoch"]) - 1) * int(event["steps"]) + int(event["step"])


class Scalars:
    """The sink. The event file is created at the first scalar: every rank may hold one (in an elastic job
    any rank may become rank 0), and only the one reporting writes."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self.Event, self.Summary, self.RecordWriter = _protos()  # a missing package fails at start, not later
        self.writer = None

    def __call__(self, event: dict[str, Any]) -> None:
        tags = TAGS.get(event.get("event"))
        if tags is None:
            return
        values = [self.Summary.Value(tag=tag, simple_value=float(event[field]))
                  for field, tag in tags.items() if event.get(field) is not None]
        writer = self._open()
        writer.write(self.Event(wall_time=time.time(), step=step_of(event),
                                summary=self.Summary(value=values)).SerializeToString())
        writer.flush()  # a TensorBoard watching the run sees each point; progress comes at most once a second

    def _open(self):
        if self.writer is None:
            Path(self.logdir).mkdir(parents=True, exist_ok=True)
            name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
            self.writer = self.RecordWriter(open(Path(self.logdir) / name, "wb"))
            self.writer.write(self.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        return self.writer

    def close(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()
