"""1. Wrapper overhead: an `hvdk8s.torch` step at one rank against a plain PyTorch step (same model,
batch and threads), both in a plain process: what the wrapper itself costs. Target: at most 1.02x."""
from __future__ import annotations

from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import step_seconds


def run(quick: bool) -> Comparison:
    models = ["mlp"] if quick else ["mlp", "resnet", "transformer"]
    steps, repeats = (5, 1) if quick else (40, 2)
    rows = []
    for model in models:
        config = {"model": model, "batch": 32, "steps": steps}
        samples = interleaved({mode: (lambda m=mode: 1000 * step_seconds(config, m, 1)) for mode in ("plain", "hvdk8s")},
                              repeats)
        rows += [Row(config=mode, group=model, samples=s) for mode, s in samples.items()]
    return Comparison("wrapper", "Wrapper overhead: hvdk8s.torch at 1 rank vs plain PyTorch", "ms/step",
                      higher_is_better=False, baseline="plain", rows=rows, target="<= 1.02x")
