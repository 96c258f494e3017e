"""2. Trainer overhead: `hvdk8s train` at 2 ranks against the hand-written Horovod loop
(hvdk8s.bench.handwritten_rank) over the same model, data, batch and optimizer: training samples/s, the
median of the epochs after the first (which pays for warm-up), launches of the two taking turns, the
ratio the median of each pair's (two launches a side were noise here: 0.85-1.16x on one hour, the
hand-written loop's rate moving 4,793-6,291 samples/s between launches). Target: at least 0.97x."""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from hvdk8s import events, tuning
from hvdk8s.bench.core import BenchError, Comparison, Row, interleaved
from hvdk8s.bench.ranks import TIMEOUT, rank_env, run_json
from hvdk8s.launch import local


def job(quick: bool, directory: Path) -> Path:
    path = directory / "bench-trainer.yaml"
    path.write_text(yaml.safe_dump({
        "name": "bench-trainer", "framework": "pytorch",
        "model": {"name": "mlp", "args": {"hidden": [512, 512]}},
        "dataset": {"name": "synthetic-images", "args": {"samples": 1024 if quick else 8192, "shape": [3, 32, 32]},
                    "test_fraction": 0.1},
        "training": {"epochs": 2 if quick else 3, "batch_size": 32, "learning_rate": 0.01, "momentum": 0.9,
                     "lr_scaling": "linear", "warmup_epochs": 0, "compression": "none", "seed": 1},
    }))
    return path


def epoch_events(job_file: Path, np: int = 2) -> list[dict]:
    """The `epoch` events of `hvdk8s train JOB --no-resume` at `np` ranks."""
    token = events.new_token()
    env = rank_env(np, {"HVDK8S_EVENTS": "json", events.TOKEN_ENV: token})
    cmd = local.command([sys.executable, "-m", "hvdk8s", "train", str(job_file), "--no-resume"], np)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    epochs = [e for e in (events.parse(line, token) for line in proc.stdout.splitlines()) if e and e["event"] == "epoch"]
    if proc.returncode != 0 or not epochs:
        raise BenchError(f"hvdk8s train {job_file.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-3000:]}")
    return epochs


def after_the_first(rates: list[float]) -> float:
    """The median of a run's epoch rates after the first (the last alone with fewer than two)."""
    return statistics.median(rates[1:] or rates[-1:])


def trainer_samples_per_s(job_file: Path, np: int = 2) -> float:
    return after_the_first([e["samples_per_s"] for e in epoch_events(job_file, np)])


def run(quick: bool) -> Comparison:
    repeats = 1 if quick else 5
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-") as tmp:
        job_file = job(quick, Path(tmp))
        samples = interleaved({
            "hand-written Horovod": lambda: after_the_first(run_json(
                "hvdk8s.bench.handwritten_rank", {"job": str(job_file)}, "horovod", 2, tuning.ALLOCATORS)["samples_per_s"]),
            "hvdk8s train": lambda: trainer_samples_per_s(job_file),
        }, repeats)
    return Comparison("trainer", "Trainer overhead: hvdk8s train vs a hand-written Horovod loop, 2 ranks, MLP",
                      "samples/s", higher_is_better=True, baseline="hand-written Horovod",
                      rows=[Row(config=c, samples=s) for c, s in samples.items()], target=">= 0.97x", paired=True)
