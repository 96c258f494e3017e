"""11. Gradient compression and convergence: `hvdk8s train` at 2 ranks with compression none (the baseline),
fp16 and PowerSGD at ranks 1 and 4, on the same jobs and seeds:

- `powersgd_digits`: the digits MLP's final test accuracy (higher is better);
- `powersgd_lm`: a small causal Transformer on the synthetic bigram tokens, its final test loss (lower is
  better).

A row's samples are its seeds (the same seeds in every row), so a ratio says how much of the baseline's
result a compression keeps. What it does not say: speed (on one host the wire is memory, not a network;
the emulated-network benchmark is what measures that).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from hvdk8s.bench.core import Comparison, Row
from hvdk8s.bench.trainer import epoch_events

# row: (training.compression, training.powersgd)
CONFIGS = {"none": ("none", None), "fp16": ("fp16", None),
           "powersgd rank 1": ("powersgd", {"rank": 1}), "powersgd rank 4": ("powersgd", {"rank": 4})}
SEEDS = (1, 2, 3)


def _job(kind: str, quick: bool, seed: int, compression: str, powersgd, directory: Path) -> Path:
    if kind == "digits":
        spec = {"model": {"name": "mlp", "args": {"hidden": [128, 64]}}, "dataset": {"name": "digits"},
                "training": {"epochs": 6 if quick else 15, "batch_size": 32, "learning_rate": 0.05,
                             "warmup_epochs": 1}}
    else:
        spec = {"model": {"name": "transformer", "args": {"d_model": 64, "heads": 4, "layers": 2, "d_ff": 128,
                                                           "max_len": 32}},
                "dataset": {"name": "synthetic-tokens", "args": {"samples": 1024 if quick else 4096, "seq_len": 32,
                                                                 "vocab_size": 64}},
                "training": {"epochs": 2 if quick else 6, "batch_size": 32, "optimizer": "adamw",
                             "learning_rate": 0.002, "warmup_epochs": 1}}
    spec["training"].update(compression=compression, seed=seed, **({"powersgd": powersgd} if powersgd else {}))
    path = directory / f"{kind}-{seed}-{compression}-{(powersgd or {}).get('rank', 0)}.yaml"
    path.write_text(yaml.safe_dump({"name": f"bench-{kind}", "framework": "pytorch", **spec}))
    return path


def _measure(kind: str, quick: bool, field: str) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {label: [] for label in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-") as tmp:
        for seed in SEEDS[:1] if quick else SEEDS:
            for label, (compression, powersgd) in CONFIGS.items():
                job_file = _job(kind, quick, seed, compression, powersgd, Path(tmp))
                samples[label].append(epoch_events(job_file)[-1][field])
    return samples


def run_digits(quick: bool) -> Comparison:
    samples = _measure("digits", quick, "test_accuracy")
    return Comparison("powersgd_digits", "Compression and convergence: digits MLP, final test accuracy at 2 ranks",
                      "test accuracy", higher_is_better=True, baseline="none",
                      rows=[Row(config=label, samples=s) for label, s in samples.items()],
                      target="powersgd within 1% of none",
                      notes="One sample per seed (the same seeds in every row); PowerSGD from step 10 "
                            "(training.powersgd.start_step), error feedback on.")


def run_lm(quick: bool) -> Comparison:
    samples = _measure("lm", quick, "test_loss")
    return Comparison("powersgd_lm", "Compression and convergence: a small Transformer on synthetic bigram "
                                     "tokens, final test loss at 2 ranks",
                      "test loss", higher_is_better=False, baseline="none",
                      rows=[Row(config=label, samples=s) for label, s in samples.items()],
                      target="powersgd within 2% of none",
                      notes="One sample per seed (the same seeds in every row); AdamW; PowerSGD from step 10.")
