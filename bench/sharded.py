"""10. Sharded optimizer state (training.shard_optimizer_state), Adam on a 29.4M-parameter MLP:

- `zero_memory`: optimizer-state and gradient bytes per rank after a step, measured off the tensors'
  storages (hvdk8s.bench.sharded_rank), at 1 and 2 ranks: unsharded hvdk8s, stage 1, stage 2, and
  torch's ZeroRedundancyOptimizer on DDP. Target: a stage's state per rank within 10% of 1/N of the
  unsharded state.
- `zero_step`: 2-rank step time of stage 1 and stage 2 against unsharded hvdk8s (target: stage 1 at
  or below 1.1x) and against ZeroRedundancyOptimizer on DDP (gloo, CPU), which holds what stage 1 holds
  (target: at or below 1.0x), interleaved and repeated.
- `zero_keras_memory`, `zero_keras_step`: the same for Keras 3 (hvdk8s.bench.sharded_rank_tf): Adam's
  state per rank at 1 and 2 ranks, and the 2-rank step time of stages 1 and 2 against unsharded
  hvdk8s.tensorflow (Keras has no ZeroRedundancyOptimizer to compare with).
"""
from __future__ import annotations

from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import run_json

RANK = "hvdk8s.bench.sharded_rank"
# config label: (mode, stage)
CONFIGS = {"hvdk8s": ("hvdk8s", 0), "stage 1": ("hvdk8s", 1), "stage 2": ("hvdk8s", 2),
           "torch ZeRO (DDP)": ("ddp", 0)}


def _model(quick: bool) -> str:
    return "0.8M-parameter MLP (quick)" if quick else "29.4M-parameter MLP"


def _run(label: str, np: int, quick: bool, steps: int) -> dict:
    mode, stage = CONFIGS[label]
    config = {"mode": mode, "stage": stage, "model": "mlp" if quick else "mlp-30m", "batch": 32, "steps": steps}
    return run_json(RANK, config, mode, np)


def run_memory(quick: bool) -> Comparison:
    rows = []
    for np in (1, 2):
        measured = {label: _run(label, np, quick, steps=1)["memory"] for label in CONFIGS}
        ranks = f"{np} rank{'s' if np > 1 else ''}"
        for what in ("optimizer_state", "gradients"):
            rows += [Row(config=label, group=f"{what.replace('_', ' ')}, {ranks}", samples=[m[what] / 2**20], x=np)
                     for label, m in measured.items()]
    return Comparison("zero_memory", f"Optimizer state and gradients per rank (Adam, {_model(quick)}): "
                                     "sharded vs unsharded, measured", "MiB",
                      higher_is_better=False, baseline="hvdk8s", rows=rows,
                      target="stage 1 and 2 optimizer state at 2 ranks within 10% of 0.5x",
                      notes="Bytes of the tensors' storages as the optimizer updates the parameters (a step "
                            "pre-hook on the optimizer that updates: hvdk8s's, the shards' copy, torch ZeRO's "
                            "local one), the largest over the ranks. Stage 1 keeps each rank's whole "
                            "gradients, stage 2 only its shard; torch's ZeroRedundancyOptimizer keeps whole "
                            "tensors per rank (its shards balance by tensor) and DDP's whole gradients "
                            "(gradient_as_bucket_view, so one copy).")


def _step_ms(run, labels, quick: bool) -> tuple[dict, int, int]:
    """2-rank ms/step of each label (`run(label, ranks, quick, steps)`), interleaved and repeated."""
    steps, repeats = (2, 1) if quick else (10, 3)
    samples = interleaved({label: (lambda label=label: 1000 * run(label, 2, quick, steps)["seconds_per_step"])
                           for label in labels}, repeats)
    return samples, steps, repeats


def run_step(quick: bool) -> Comparison:
    samples, steps, repeats = _step_ms(_run, CONFIGS, quick)
    rows = []
    for group, baseline, labels in (("vs unsharded hvdk8s", "hvdk8s", ("hvdk8s", "stage 1", "stage 2")),
                                    ("vs torch ZeRO", "torch ZeRO (DDP)", ("torch ZeRO (DDP)", "stage 1", "stage 2"))):
        rows += [Row(config=label, group=group, samples=samples[label]) for label in labels]
    return Comparison("zero_step", f"2-rank step time, Adam on a {_model(quick)}: sharded vs unsharded hvdk8s "
                                   "and vs torch's ZeroRedundancyOptimizer on DDP (gloo)", "ms/step",
                      higher_is_better=False, baseline={"vs unsharded hvdk8s": "hvdk8s",
                                                        "vs torch ZeRO": "torch ZeRO (DDP)"},
                      rows=rows, target="stage 1 <= 1.1x unsharded; <= 1.0x torch ZeRO",
                      notes=f"{steps} steps per launch between barriers, {repeats} interleaved launches per "
                            "configuration; a row's samples are its launches. The same samples appear in both "
                            "groups.")


KERAS_RANK = "hvdk8s.bench.sharded_rank_tf"
KERAS_CONFIGS = {"hvdk8s.tensorflow": 0, "stage 1": 1, "stage 2": 2}


def _run_keras(label: str, np: int, quick: bool, steps: int) -> dict:
    config = {"stage": KERAS_CONFIGS[label], "model": "mlp" if quick else "mlp-30m", "batch": 32, "steps": steps}
    return run_json(KERAS_RANK, config, "hvdk8s", np)


def run_keras_memory(quick: bool) -> Comparison:
    rows = []
    for np in (1, 2):
        ranks = f"optimizer state, {np} rank{'s' if np > 1 else ''}"
        rows += [Row(config=label, group=ranks, x=np,
                     samples=[_run_keras(label, np, quick, steps=1)["memory"]["optimizer_state"] / 2**20])
                 for label in KERAS_CONFIGS]
    return Comparison("zero_keras_memory", f"Keras 3: Adam's state per rank ({_model(quick)}): sharded vs "
                                           "unsharded, measured", "MiB", higher_is_better=False,
                      baseline="hvdk8s.tensorflow", rows=rows,
                      target="stage 1 and 2 optimizer state at 2 ranks within 10% of 0.5x",
                      notes="Bytes of the optimizer's per-variable state (the moments; unsharded: the "
                            "optimizer's variables but its scalars, sharded: the working copy's on this rank's "
                            "slices) after two steps, the largest over the ranks.")


def run_keras_step(quick: bool) -> Comparison:
    samples, steps, repeats = _step_ms(_run_keras, KERAS_CONFIGS, quick)
    return Comparison("zero_keras_step", f"Keras 3: 2-rank step time, Adam on a {_model(quick)}: sharded vs "
                                         "unsharded hvdk8s.tensorflow", "ms/step", higher_is_better=False,
                      baseline="hvdk8s.tensorflow",
                      rows=[Row(config=label, group="vs unsharded", samples=samples[label]) for label in KERAS_CONFIGS],
                      target="stage 1 <= 1.1x unsharded",
                      notes=f"Each step a traced optimizer.apply (as model.fit's); {steps} steps per launch between "
                            f"barriers, {repeats} interleaved launches per configuration.")
