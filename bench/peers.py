"""3. Peers: an hvdk8s 2-rank step against torch DDP (gloo) and raw Horovod, per model, on an idle
machine and again beside a second 2-rank job (shared clusters and CI are rarely idle).
Target: no slower than DDP in both conditions.

5. Scaling: samples/s of hvdk8s at 1 and 2 ranks per model (global batch grows with the ranks)."""
from __future__ import annotations

import contextlib

from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import contending_job, step_seconds

MODES = ("ddp", "horovod", "hvdk8s")
BATCH = 32


def _models(quick: bool) -> list[str]:
    return ["mlp"] if quick else ["mlp", "resnet", "transformer"]


def _plan(quick: bool) -> tuple[int, int]:
    return (5, 1) if quick else (30, 2)  # steps per launch, repeats


def run(quick: bool) -> Comparison:
    steps, repeats = _plan(quick)
    rows = []
    for condition in ("idle", "contended"):
        # quick: raw Horovod only when idle (it is there to tell Horovod's defaults from the wrapper's)
        modes = MODES if not (quick and condition == "contended") else ("ddp", "hvdk8s")
        for model in _models(quick):
            config = {"model": model, "batch": BATCH, "steps": steps}
            with contending_job() if condition == "contended" else contextlib.nullcontext():
                samples = interleaved({m: (lambda m=m: 1000 * step_seconds(config, m, 2)) for m in modes}, repeats)
            rows += [Row(config=m, group=f"{model}, {condition}", samples=s) for m, s in samples.items()]
    return Comparison("peers", "2-rank step time: hvdk8s vs torch DDP (gloo) vs raw Horovod", "ms/step",
                      higher_is_better=False, baseline="ddp", rows=rows, target="<= 1.00x of DDP, idle and contended")


def run_scaling(quick: bool) -> Comparison:
    steps, repeats = _plan(quick)[0], 1
    rows = []
    for model in _models(quick):
        config = {"model": model, "batch": BATCH, "steps": steps}
        samples = interleaved({f"{n} rank{'s' if n > 1 else ''}": (lambda n=n: n * BATCH / step_seconds(config, "hvdk8s", n))
                               for n in (1, 2)}, repeats)
        rows += [Row(config=c, group=model, samples=s, x=float(c[0])) for c, s in samples.items()]
    return Comparison("scaling", "Scaling: hvdk8s samples/s at 1 and 2 ranks (2 cores: each rank gets half)",
                      "samples/s", higher_is_better=True, baseline="1 rank", rows=rows,
                      notes="On one 2-core machine 2 ranks share the cores 1 rank had, so ~1.0x is the ideal here; "
                            "on a cluster each rank brings its own GPU.")
