"""The GPU check of the tuning profiles (hvdk8s/tuning.py): on one GPU, a step of hvdk8s.torch under each
profile against plain PyTorch and raw Horovod, for ResNet-20 and the Transformer, a few hundred steps per
launch, interleaved and repeated; that Horovod's collectives run on NCCL there; the ratios printed (and,
with -d, written as a report). `auto` is `none` for GPU jobs: on one H200 `shared-cpu` gained nothing
(bench/results/experiments.md#gpu-check).

    bash scripts/gpu-check.sh WHEELS OUT [args]    # on a GPU machine: Horovod with NCCL built first
    python -m hvdk8s.bench.gpu_check [--steps 300] [--repeats 3] [-d DIR]
    python -m hvdk8s.bench.gpu_check --dry-run    # no GPU: the same code path, 2 steps of ResNet-20 on CPU (CI)
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from hvdk8s import tuning
from hvdk8s.bench import machine, report
from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import step_seconds
from hvdk8s.launch import local

MODELS = ("resnet", "transformer")
BATCH = 64
CPU_BOX = tuning.SHARED_CPU_VARIABLES


def controller() -> str:
    """MPI where the machine has mpirun (as an MPIJob's ranks run), else Gloo through horovodrun."""
    return local.DEFAULT_CONTROLLER if shutil.which("mpirun") else "gloo"


def configs() -> dict[str, tuple[str, Optional[dict], bool]]:
    """{row: (step_rank mode, env over the launcher's, started by mpirun)}: each profile named explicitly,
    whatever `auto` resolves to on the machine."""
    profile = {name: tuning.profile_env(name, tuning.Placement(ranks=1, gpus=True, library=tuning.local_library()), {})
               for name in ("shared-cpu", "none")}
    return {
        "plain": ("plain", None, False),
        "horovod": ("horovod", None, True),
        "hvdk8s, tuning none": ("hvdk8s", {**dict.fromkeys(CPU_BOX), **profile["none"]}, True),
        "hvdk8s, tuning shared-cpu": ("hvdk8s", {**dict.fromkeys(CPU_BOX), **profile["shared-cpu"]}, True),
    }


NCCL_PROBE = """
import sys, torch, horovod.torch as hvd
hvd.init()
assert torch.cuda.is_available(), "no GPU visible"
hvd.allreduce(torch.ones(1 << 20, device="cuda"), name="gpu_check.nccl")
hvd.shutdown()
"""


def nccl_used() -> str:
    """Why Horovod's allreduce of a GPU tensor did not run on NCCL here, or '' when its timeline shows it did."""
    import horovod.torch as hvd

    if not hvd.nccl_built():
        return "Horovod was built without NCCL"
    with tempfile.TemporaryDirectory(prefix="hvdk8s-gpu-check-") as tmp:
        timeline = Path(tmp) / "timeline.json"
        env = {**local.environment(1, profile="none"), "HOROVOD_TIMELINE": str(timeline)}
        proc = subprocess.run(local.command([sys.executable, "-c", NCCL_PROBE], 1, controller()), env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return f"the probe failed ({proc.returncode}): {proc.stderr[-2000:]}"
        text = timeline.read_text() if timeline.exists() else ""
    return "" if "NCCL_ALLREDUCE" in text else "Horovod's timeline shows no NCCL_ALLREDUCE"


def run(steps: int, repeats: int, dry_run: bool, nccl: str) -> Comparison:
    rows, started_by = [], controller()
    for model in MODELS[:1] if dry_run else MODELS:  # a dry run: every path once (the models differ in config only)
        config = {"model": model, "batch": BATCH if not dry_run else 4, "steps": steps,
                  "warmup": 10 if not dry_run else 1}
        measures = {name: (lambda mode=mode, env=env, launcher=launcher:
                           1000 * step_seconds(config, mode, 1, env, started_by, launcher))
                    for name, (mode, env, launcher) in configs().items()}
        rows += [Row(config=name, group=model, samples=s) for name, s in interleaved(measures, repeats).items()]
    return Comparison("gpu_check", "One GPU: hvdk8s.torch under each tuning profile vs plain PyTorch and raw Horovod",
                      "ms/step", higher_is_better=False, baseline="plain", rows=rows,
                      notes=f"1 rank on 1 GPU; Horovod's ranks started through {started_by}; NCCL: {nccl}. "
                            "`auto` resolves to `none` for GPU jobs until these ratios say otherwise.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdk8s.bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="no GPU needed: 2 steps on CPU, NCCL not checked")
    parser.add_argument("-d", "--output-dir", default=None)
    args = parser.parse_args(argv)
    why = ""
    if args.dry_run:
        args.steps, args.repeats = 2, 1
        nccl = "not checked (dry run)"
        print("gpu_check: dry run (CPU, 2 steps): NCCL not checked, the ratios mean nothing", flush=True)
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no GPU visible (use --dry-run to exercise the script on CPU)", file=sys.stderr)
            return 2
        why = nccl_used()
        nccl = "used (Horovod's timeline shows NCCL_ALLREDUCE)" if not why else "NOT used: " + why
        print(f"gpu_check: NCCL {nccl}", flush=True)
    comparison = run(args.steps, args.repeats, args.dry_run, nccl)
    described = machine.describe()
    print(report.markdown([comparison], described, args.dry_run))
    if args.output_dir:
        report.write(Path(args.output_dir), [comparison], described, args.dry_run)
    return 1 if why else 0  # the ratios are still measured and shown: a GPU machine's time is scarce


if __name__ == "__main__":
    raise SystemExit(main())
