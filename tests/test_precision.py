"""Mixed precision and gradient clipping in hvdk8s's trainer, both frameworks, on real ranks.
(Adapter-level equivalence, 2 ranks against one process with clipping and fp16 loss scaling, is in
test_torch_adapter.py and test_tensorflow.py.)"""
from __future__ import annotations

import re

import pytest

from conftest import DIGITS_JOB, cli

pytestmark = pytest.mark.ranks
FRAMEWORKS = ["pytorch", "tensorflow"]


def _launch(*sets: str):
    run = cli("launch", "--local", "-np", "2", DIGITS_JOB, *[a for s in sets for a in ("--set", s)])
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _final_accuracy(out: str) -> float:
    return float(re.search(r"done: test accuracy ([\d.]+)%", out).group(1))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_with_clipping_trains_digits_to_95_percent(framework):
    out = _launch(f"framework={framework}", "training.precision=bf16", "training.clip_grad_norm=5.0")
    assert "precision bf16" in out
    assert _final_accuracy(out) >= 95.0, out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fp16_runs_with_dynamic_loss_scaling(framework):
    out = _launch(f"framework={framework}", "training.precision=fp16", "training.epochs=10")
    assert "precision fp16" in out
    scales = [float(s) for s in re.findall(r"loss scale (\S+)", out)]
    assert len(scales) == 10, out  # one per epoch
    assert all(s > 1.0 for s in scales), scales  # really scaled (the loss is multiplied before backward)
    losses = [float(s) for s in re.findall(r"  loss ([\d.]+)  acc", out)]
    assert all(l == l for l in losses) and losses[-1] < losses[0] / 5, losses  # finite and learning
    assert _final_accuracy(out) >= 93.0, out
