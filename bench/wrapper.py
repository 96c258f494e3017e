"""1. Wrapper overhead: an `hvdk8s.torch` step at one rank against a plain PyTorch step (same model,
batch and threads). Target: at most 1.02x.

Two ways a one-rank job starts, each with its own plain baseline: a plain process (`python train.py`,
what the wrapper alone costs: Horovod initialised, the wrapped optimizer) and `mpirun -np 1` (what
`launch --local -np 1` runs: the same plus mpirun's environment for both). The plain baseline gets
hvdk8s's malloc settings too (hvdk8s/tuning.py MALLOC, which every rank hvdk8s starts has): they speed a
step up by themselves, and this row is the wrapper's cost. Measured A B A B in turn
with more repeats than other benchmarks, because the effect sought (2%) is below one run's noise here."""
from __future__ import annotations

from hvdk8s import tuning
from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import step_seconds

HOW = {"one process": False, "mpirun -np 1": True}


def run(quick: bool) -> Comparison:
    models = ["mlp"] if quick else ["mlp", "resnet", "transformer"]
    steps, repeats = (5, 1) if quick else (60, 4)
    rows = []
    for model in models:
        config = {"model": model, "batch": 32, "steps": steps}
        configs = {(how, mode): (lambda m=mode, launcher=launcher:
                                 1000 * step_seconds(config, m, 1, tuning.MALLOC, launcher=launcher))
                   for how, launcher in HOW.items() for mode in ("plain", "hvdk8s")}
        samples = interleaved(configs, repeats)
        rows += [Row(config=mode, group=f"{model}, {how}", samples=s) for (how, mode), s in samples.items()]
    return Comparison("wrapper", "Wrapper overhead: hvdk8s.torch at 1 rank vs plain PyTorch", "ms/step",
                      higher_is_better=False, baseline="plain", rows=rows, target="<= 1.02x",
                      notes="Each hvdk8s row against the plain row started the same way: as one process "
                            "(the wrapper's own cost) and under `mpirun -np 1` (as `launch --local -np 1`).")
