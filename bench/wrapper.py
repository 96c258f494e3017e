"""1. Wrapper overhead: an `hvdk8s.torch` step at one rank against a plain PyTorch step (same model,
batch and threads). Target: at most 1.02x.

Two ways a one-rank job starts, each with its own plain baseline: a plain process (`python train.py`,
what the wrapper alone costs: Horovod initialised, the wrapped optimizer) and `mpirun -np 1` (what
`launch --local -np 1` runs: the same plus mpirun's environment for both). The plain baseline gets
hvdk8s's allocator settings too (hvdk8s/tuning.py ALLOCATORS, which every CPU rank hvdk8s starts has): they speed a
step up by themselves, and this row is the wrapper's cost. The hvdk8s rank runs as hvdk8s starts a rank
alone: with Horovod's cycle at 20 ms (tuning.SINGLE_RANK).

The effect sought (2%) is far below this machine's drift (10-40% between runs a minute apart), so the
two processes of a pair run at once and take turns (`ranks.taking_turns`): a few steps of one, then of
the other, for many turns, each sample paired with its neighbour in time."""
from __future__ import annotations

from hvdk8s import tuning
from hvdk8s.bench.core import Comparison, Row
from hvdk8s.bench.ranks import taking_turns

HOW = {"one process": False, "mpirun -np 1": True}


def run(quick: bool) -> Comparison:
    models = ["mlp"] if quick else ["mlp", "resnet", "transformer"]
    turns, steps_per_turn = (2, 2) if quick else (100, 5)
    rows = []
    for model in models:
        for how, launcher in HOW.items():
            pair = {mode: (mode, tuning.ALLOCATORS, launcher) for mode in ("plain", "hvdk8s")}
            turned = taking_turns(pair, {"model": model, "batch": 32}, turns, steps_per_turn)
            rows += [Row(config=mode, group=f"{model}, {how}", samples=[1000 * s for s in turned[mode]])
                     for mode in pair]
    return Comparison("wrapper", "Wrapper overhead: hvdk8s.torch at 1 rank vs plain PyTorch", "ms/step",
                      higher_is_better=False, baseline="plain", rows=rows, target="<= 1.02x", paired=True,
                      notes=f"Each hvdk8s row against the plain row started the same way: as one process "
                            f"(the wrapper's own cost) and under `mpirun -np 1` (as `launch --local -np 1`). "
                            f"The two ran at once, taking turns of {steps_per_turn} steps, {turns} turns each "
                            f"(a row's samples are its turns), so each hvdk8s turn is paired with the plain "
                            f"turn beside it in time.")
