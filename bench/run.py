"""`hvdk8s bench`: run the chosen benchmarks in order and write their report."""
from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import Sequence

from hvdk8s.bench.core import CannotRunHere
from hvdk8s.core import suggest
from hvdk8s.core.errors import UserError

# name: (where its run(quick) lives, what it measures). Order: the report's.
BENCHMARKS = {
    "wrapper": ("hvdk8s.bench.wrapper:run", "hvdk8s.torch at 1 rank vs plain PyTorch"),
    "trainer": ("hvdk8s.bench.trainer:run", "hvdk8s train vs a hand-written Horovod loop, 2 ranks"),
    "peers": ("hvdk8s.bench.peers:run", "2-rank step: hvdk8s vs torch DDP vs raw Horovod, idle and contended"),
    "allreduce": ("hvdk8s.bench.allreduce:run", "allreduce 1 KB-256 MB, fp32 vs fp16, bus bandwidth"),
    "scaling": ("hvdk8s.bench.peers:run_scaling", "samples/s at 1 and 2 ranks"),
    "knobs": ("hvdk8s.bench.knobs:run", "fusion threshold, cycle time, contention settings, allreduce algorithm"),
    "tf_fit": ("hvdk8s.bench.tf_fit:run", "Keras model.fit through hvdk8s.tensorflow vs plain Keras"),
    "tf_input": ("hvdk8s.bench.tf_input:run", "the TensorFlow input pipeline vs the PyTorch loader"),
    "loader": ("hvdk8s.bench.loader_prefetch:run", "loader prefetch on a shard dataset from disk"),
    "zero_memory": ("hvdk8s.bench.sharded:run_memory", "sharded optimizer: state and gradient bytes per rank, 1 and 2 ranks"),
    "zero_step": ("hvdk8s.bench.sharded:run_step", "sharded optimizer: 2-rank step vs unsharded and torch ZeRO"),
    "zero_keras_memory": ("hvdk8s.bench.sharded:run_keras_memory", "sharded optimizer, Keras 3: state per rank, 1 and 2 ranks"),
    "zero_keras_step": ("hvdk8s.bench.sharded:run_keras_step", "sharded optimizer, Keras 3: 2-rank step vs unsharded"),
    "powersgd_digits": ("hvdk8s.bench.compression:run_digits", "compression none/fp16/PowerSGD: digits accuracy, 2 ranks"),
    "powersgd_lm": ("hvdk8s.bench.compression:run_lm", "compression none/fp16/PowerSGD: Transformer LM loss, 2 ranks"),
    "network": ("hvdk8s.bench.network:run", "2 emulated nodes on shaped links: compressions vs DDP's hooks"),
}


def chosen(only: Sequence[str]) -> list[str]:
    """Benchmark names from --only (repeated or comma-separated); all of them when empty."""
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise UserError("--only: " + "; ".join(f"unknown benchmark {n} ({suggest.hint(n, BENCHMARKS, 'choose from')})"
                                               for n in unknown))
    return [n for n in BENCHMARKS if n in names] if names else list(BENCHMARKS)


def prepare_output(output: str) -> Path:
    from hvdk8s.core.atomic import unwritable_reason  # here: `hvdk8s --help` imports this module

    reason = unwritable_reason(output)
    if reason is not None:
        raise UserError(f"--output-dir: cannot write to {output} ({reason})")
    return Path(output)


def run(names: list[str], quick: bool, out: Path, say) -> list:
    from hvdk8s.bench import machine, report  # as above

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up notices are not results
    described = machine.describe()
    results = []
    for name in names:
        where, what = BENCHMARKS[name]
        module, func = where.split(":")
        say(f"{name}: {what} ...")
        began = time.monotonic()
        try:
            comparison = getattr(importlib.import_module(module), func)(quick)
        except CannotRunHere as e:  # e.g. the emulated network without root: the others still run
            say(f"{name}: skipped: {e}")
            continue
        results.append(comparison)
        say(f"{name}: done in {time.monotonic() - began:.0f}s")
        report.write(out, results, described, quick)  # after each: a long run's finished parts survive
    return results
