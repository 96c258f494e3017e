"""6. Horovod's knobs against step time, for a model of many small tensors (49 layers of 64 units):
the fusion threshold and the cycle time, idle; then, beside a second 2-rank job, the settings that
decide how a waiting rank uses the CPU (OpenMPI's busy polling, Horovod's cycle). Also the controller
(MPI or Gloo) and fp16 compression on CPU ranks, for the 6.3M-parameter MLP; and Open MPI's allreduce
algorithm for the large gradients of a 29.4M-parameter MLP (hvdk8s's rules: the ring from 16 MB, against
Open MPI's own choice). hvdk8s's launch defaults follow from this (hvdk8s/tuning.py,
hvdk8s/launch/local.py, hvdk8s/compression.py)."""
from __future__ import annotations

import contextlib

from hvdk8s import tuning
from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import contending_job, run_json, step_seconds

MB = 1 << 20
FUSION = {"no fusion": 0, "1 MB": 1 * MB, "128 MB": 128 * MB}
CYCLE_MS = ("1", "5", "20")
YIELD = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# (HOROVOD_CPU_OPERATIONS=gloo under the MPI controller crashed a rank with SIGSEGV here: not offered.)
NOT_SLEEPY = {"LD_PRELOAD": None}  # without hvdk8s's sleepy negotiation (hvdk8s/tuning.py)
OPEN_MPIS_CHOICE = dict.fromkeys(tuning.allreduce_rules(""))  # without hvdk8s's allreduce rules
UNDER_CONTENTION = {
    # unset: what hvdk8s's defaults replace
    "OpenMPI defaults": {"OMPI_MCA_mpi_yield_when_idle": None, **NOT_SLEEPY},
    "mpi_yield_when_idle + sleepy negotiation (hvdk8s)": YIELD,
    "mpi_yield_when_idle alone": {**YIELD, **NOT_SLEEPY},
    "yield + cycle 5 ms": {**YIELD, **NOT_SLEEPY, "HOROVOD_CYCLE_TIME": "5"},
    "yield + Gloo controller": {**YIELD, **NOT_SLEEPY, "controller": "gloo"},
}


def run(quick: bool) -> Comparison:
    steps, repeats = (5, 1) if quick else (40, 3)
    model = "many-small"
    config = {"model": model, "batch": 32, "steps": steps}
    rows = []

    def sweep(group: str, envs: dict[str, dict], baseline: str, contended: bool = False):
        def measure(env: dict) -> float:
            env = dict(env)
            controller = env.pop("controller", "mpi")
            return 1000 * step_seconds(config, "hvdk8s", 2, env, controller)

        with contending_job() if contended else contextlib.nullcontext():
            samples = interleaved({name: (lambda env=env: measure(env)) for name, env in envs.items()}, repeats)
        rows.extend(Row(config=name if name != baseline else "defaults", group=group, samples=s)
                    for name, s in samples.items())

    # With hvdk8s's own settings (hvdk8s/tuning.py), as users get them.
    sweep("fusion threshold", {k: {"HOROVOD_FUSION_THRESHOLD": str(v)} for k, v in
                               (FUSION if not quick else {"no fusion": 0, "128 MB": 128 * MB}).items()}, "128 MB")
    sweep("cycle time", {f"{ms} ms": {"HOROVOD_CYCLE_TIME": ms} for ms in (CYCLE_MS if not quick else ("5",))},
          "1 ms")
    mlp = {"model": "mlp", "batch": 32, "steps": steps}
    large_group = f"allreduce algorithm ({'0.8M' if quick else '29.4M'}-parameter MLP)"
    samples = interleaved({
        "MPI": lambda: 1000 * step_seconds(mlp, "hvdk8s", 2),
        "Gloo": lambda: 1000 * step_seconds(mlp, "hvdk8s", 2, controller="gloo"),
        **({} if quick else {"MPI + fp16": lambda: 1000 * step_seconds({**mlp, "compression": "fp16"}, "hvdk8s", 2)}),
    }, repeats)
    rows.extend(Row(config=name, group="controller, compression (MLP)", samples=s) for name, s in samples.items())
    large = {"mode": "hvdk8s", "compression": "none", "model": "mlp" if quick else "mlp-30m", "batch": 32,
             "steps": 3 if quick else 10, "threads": 1}

    def large_step(env: dict) -> float:
        return 1000 * run_json("hvdk8s.bench.network_rank", large, "hvdk8s", 2, env=env)["seconds_per_step"]

    samples = interleaved({"Open MPI's choice": lambda: large_step(OPEN_MPIS_CHOICE),
                           "ring from 16 MB (hvdk8s)": lambda: large_step({})}, repeats)
    rows.extend(Row(config=name, group=large_group, samples=s) for name, s in samples.items())
    sweep("contended", UNDER_CONTENTION if not quick else dict(list(UNDER_CONTENTION.items())[:3]), "OpenMPI defaults",
          contended=True)
    return Comparison("knobs", "Horovod and Open MPI knobs, 2 ranks", "ms/step",
                      higher_is_better=False, rows=rows,
                      baseline={**{g: "defaults" for g in ("fusion threshold", "cycle time", "contended")},
                                "controller, compression (MLP)": "MPI",
                                large_group: "Open MPI's choice"},
                      notes="defaults: Horovod 0.28's fusion threshold 128 MB and cycle time 1 ms; under contention, "
                            "OpenMPI's busy polling everywhere, Horovod's negotiation included (what hvdk8s's "
                            "mpi_yield_when_idle=1 and sleepy negotiation replace). Contended: "
                            "a torch DDP 2-rank job trains beside the measured one on the same 2 cores. "
                            "Allreduce algorithm: 2 ranks of one thread, a 29.4M-parameter MLP (0.8M with --quick), "
                            "SGD, batch 32; hvdk8s's allreduce rules (hvdk8s/tuning.py) against none.")
