"""Mixed precision, gradient clipping and fp16 gradient compression in hvdk8s's trainer, both frameworks, on
real ranks.
(Adapter-level equivalence, 2 ranks against one process with clipping and fp16 loss scaling, is in
test_torch_adapter.py and test_tensorflow.py.)"""
from __future__ import annotations

import math

import pytest

from conftest import DIGITS_JOB, cli, events_of

pytestmark = pytest.mark.ranks
FRAMEWORKS = ["pytorch", "tensorflow"]


def _launch(*sets: str) -> str:
    """The launch's records, one a line (read with events_of)."""
    run = cli("launch", "--local", "-np", "2", "--log-format", "json", DIGITS_JOB,
              *[a for s in sets for a in ("--set", s)])
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _precision(out: str) -> str:
    [started] = events_of(out, "start")
    return started["precision"]


def _final_accuracy(out: str) -> float:
    [done] = events_of(out, "done")
    return done["test_accuracy"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_with_clipping_and_fp16_compression_trains_digits_to_95_percent(framework):
    """Gradient compression too (fp16 on the wire, whatever the compute precision): one launch for the three."""
    out = _launch(f"framework={framework}", "training.precision=bf16", "training.clip_grad_norm=5.0",
                  "training.compression=fp16")
    [started] = events_of(out, "start")
    assert (started["precision"], started["compression"], started["ranks"]) == ("bf16", "fp16", 2), out
    assert _final_accuracy(out) >= 0.95, out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fp16_runs_with_dynamic_loss_scaling(framework):
    out = _launch(f"framework={framework}", "training.precision=fp16", "training.epochs=10")
    assert _precision(out) == "fp16", out
    epochs = events_of(out, "epoch")
    scales = [e.get("loss_scale") for e in epochs]
    assert len(scales) == 10, out  # one per epoch
    # Really scaled (the loss is multiplied before backward):
    assert all(s is not None and s > 1.0 for s in scales), scales
    losses = [e["loss"] for e in epochs]  # a non-finite loss is logged as null
    assert all(l is not None and math.isfinite(l) for l in losses) and losses[-1] < losses[0] / 5, losses  # learning
    assert _final_accuracy(out) >= 0.93, out
