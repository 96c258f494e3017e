"""6. Horovod's knobs against step time, for a model of many small tensors (49 layers of 64 units):
the fusion threshold and the cycle time, idle; then, beside a second 2-rank job, the settings that
decide how a waiting rank uses the CPU (OpenMPI's busy polling, Horovod's cycle). Also the controller
(MPI or Gloo) and fp16 compression on CPU ranks, for the 6.3M-parameter MLP. hvdk8s's launch
defaults follow from this (hvdk8s/launch/tuning.py, hvdk8s/launch/local.py, hvdk8s/compression.py)."""
from __future__ import annotations

import contextlib

from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import contending_job, step_seconds

MB = 1 << 20
FUSION = {"no fusion": 0, "1 MB": 1 * MB, "16 MB": 16 * MB, "128 MB": 128 * MB}
CYCLE_MS = ("0.5", "1", "5", "20")
UNDER_CONTENTION = {
    "Horovod defaults": {},
    "mpi_yield_when_idle": {"OMPI_MCA_mpi_yield_when_idle": "1"},
    "cycle 5 ms": {"HOROVOD_CYCLE_TIME": "5"},
    "gloo CPU ops": {"HOROVOD_CPU_OPERATIONS": "gloo"},
}


def _defaults_off() -> dict:
    """The Horovod defaults, whatever hvdk8s's launcher would add."""
    from hvdk8s.launch import tuning
    return {name: None for name in tuning.HOROVOD_DEFAULTS}


def run(quick: bool) -> Comparison:
    steps, repeats = (5, 1) if quick else (40, 3)
    model = "many-small"
    config = {"model": model, "batch": 32, "steps": steps}
    rows = []

    def sweep(group: str, envs: dict[str, dict], baseline: str, contended: bool = False):
        with contending_job() if contended else contextlib.nullcontext():
            samples = interleaved({name: (lambda env=env: 1000 * step_seconds(config, "hvdk8s", 2, env))
                                   for name, env in envs.items()}, repeats)
        rows.extend(Row(config=name if name != baseline else "Horovod defaults", group=group, samples=s)
                    for name, s in samples.items())

    plain = _defaults_off()
    sweep("fusion threshold", {k: {**plain, "HOROVOD_FUSION_THRESHOLD": str(v)} for k, v in
                               (FUSION if not quick else {"no fusion": 0, "128 MB": 128 * MB}).items()}, "128 MB")
    sweep("cycle time", {f"{ms} ms": {**plain, "HOROVOD_CYCLE_TIME": ms} for ms in (CYCLE_MS if not quick else ("1", "5"))},
          "1 ms")
    mlp = {"model": "mlp", "batch": 32, "steps": steps}
    samples = interleaved({
        "MPI": lambda: 1000 * step_seconds(mlp, "hvdk8s", 2),
        "Gloo": lambda: 1000 * step_seconds(mlp, "hvdk8s", 2, controller="gloo"),
        "MPI + fp16": lambda: 1000 * step_seconds({**mlp, "compression": "fp16"}, "hvdk8s", 2),
    }, repeats)
    rows.extend(Row(config=name, group="controller, compression (MLP)", samples=s) for name, s in samples.items())
    sweep("contended", {k: {**plain, **v} for k, v in UNDER_CONTENTION.items()}, "Horovod defaults", contended=True)
    return Comparison("knobs", "Horovod knobs, 2 ranks, a model of 98 small tensors", "ms/step",
                      higher_is_better=False, rows=rows,
                      baseline={**{g: "Horovod defaults" for g in ("fusion threshold", "cycle time", "contended")},
                                "controller, compression (MLP)": "MPI"},
                      notes="Horovod 0.28 defaults: fusion threshold 128 MB, cycle time 1 ms.")
