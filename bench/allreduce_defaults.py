"""Measures what hvdk8s's defaults rest on, on this machine, as ratios within one run:

- controller: Horovod's Gloo controller against its MPI controller (default: MPI);
- compression: fp16 against none on CPU ranks (`auto` picks none on CPU and within one node).

Configurations are interleaved (A B C A B C ...) and the median is taken, since these machines are
shared and noisy. Usage: .venv/bin/python bench/allreduce_defaults.py [--repeats 3] [--steps 30] [-np 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdk8s.launch import local

HERE = Path(__file__).resolve().parent
CONFIGS = [("mpi", "none"), ("gloo", "none"), ("mpi", "fp16")]


def measure(controller: str, compression: str, steps: int, np: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = local.command([sys.executable, str(HERE / "step_rank.py"), str(out), compression, str(steps)],
                            np, controller)
        proc = subprocess.run(cmd, env=local.environment(np), capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise SystemExit(f"{controller}/{compression} failed:\n{proc.stdout}\n{proc.stderr}")
        return json.loads(out.read_text())["seconds_per_step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("-np", type=int, default=2)
    args = ap.parse_args()
    times: dict[tuple[str, str], list[float]] = {c: [] for c in CONFIGS}
    for _ in range(args.repeats):
        for controller, compression in CONFIGS:
            times[(controller, compression)].append(measure(controller, compression, args.steps, args.np))
    median = {c: statistics.median(v) for c, v in times.items()}
    base = median[("mpi", "none")]
    print(f"{args.np} CPU ranks, 4.3M-parameter MLP, batch 32/rank, {args.steps} steps x {args.repeats} repeats")
    print(f"{'controller':<10} {'compression':<12} {'ms/step':>8} {'vs MPI+none':>12}")
    for (controller, compression), t in median.items():
        print(f"{controller:<10} {compression:<12} {t * 1e3:8.1f} {t / base:11.2f}x")
    result = {f"{c}+{z}": {"ms_per_step": median[(c, z)] * 1e3, "ratio_vs_mpi_none": median[(c, z)] / base}
              for c, z in CONFIGS}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
