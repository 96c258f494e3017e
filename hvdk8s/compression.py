"""Which gradient compression `auto` means, as measured rather than by habit.

fp16 halves the bytes on the wire but adds a cast on each side and an fp16 reduction, and rounds every
gradient. Within one node (shared memory) it was first measured costing more than it saved (2 CPU ranks,
1.34x the step); later runs of `hvdk8s bench --only knobs` gave 0.88-0.94x for that one model, and across
models (2 CPU ranks, 2026-12-05) 0.93x and 0.97x for two MLPs, 1.01x for ResNet-20 and 1.02x for the
Transformer: too little saved for the rounding, so `auto` keeps none within a node (docs/performance.md).
Across nodes it pays: 2 emulated nodes on TCP links (`hvdk8s bench --only network`, 29.4M-parameter MLP,
CPU ranks) stepped in 0.57-0.71x the time at 1 Gbit/s, 0.77-0.97x at 10 Gbit/s and 0.70-1.00x unshaped
(the last five runs, docs/performance.md). So `auto` is fp16 wherever the job spans more than one node:
for GPU jobs as before (NCCL's fp16 allreduce across nodes), and now for CPU jobs too.

powersgd sends low-rank factors of each weight's gradient with error feedback
(hvdk8s/_torch_powersgd.py, hvdk8s/_tf_powersgd.py): chosen by the job, never by `auto`, because it
changes what the model learns (docs/training.md), although it paid wherever the link binds (rank 4:
0.19-0.30x at 1 Gbit/s, 0.80-1.00x at 10 Gbit/s, 0.80-1.05x unshaped, over the runs in
docs/performance.md).
"""
from __future__ import annotations

CHOICES = ("auto", "fp16", "none", "powersgd")
# PowerSGD's settings when a job or a distribute() call leaves them out (both frameworks)
POWERSGD_RANK, POWERSGD_START_STEP, POWERSGD_MIN_COMPRESSION_RATE = 4, 10, 2.0


def resolve(choice: str, *, nodes: int) -> str:
    """'fp16', 'none' or 'powersgd' for a job's `training.compression` on `nodes` nodes."""
    if choice not in CHOICES:
        raise ValueError(f"compression must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice != "auto":
        return choice
    return "fp16" if nodes > 1 else "none"


def should_compress(rows: int, cols: int, rank: int, min_rate: float) -> bool:
    """PowerSGD compresses a gradient seen as a rows x cols matrix when its rank-r factors are at least
    `min_rate` times smaller than it (as DDP's hook decides); both frameworks' PowerSGD use this rule."""
    return (rows + cols) * min(rank, rows, cols) * min_rate <= rows * cols
