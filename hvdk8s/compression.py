"""Which gradient compression `auto` means, as measured rather than by habit.

fp16 halves the bytes on the wire but adds a cast on each side and an fp16 reduction. It pays where the
wire is the bottleneck: gradients that cross a network between GPU nodes. Within one node (shared
memory, NVLink) and on CPUs it costs more than it saves: on 2 CPU ranks, Horovod with fp16 took 1.34x
as long per step as without (`hvdk8s bench --only knobs`; about 2x in earlier measurements by hand).

powersgd (PyTorch) sends low-rank factors of each weight's gradient with error feedback
(hvdk8s/_torch_powersgd.py): chosen by the job, never by `auto`, until a measurement on slow links says
where it pays.
"""
from __future__ import annotations

CHOICES = ("auto", "fp16", "none", "powersgd")


def resolve(choice: str, *, on_gpu: bool, nodes: int) -> str:
    """'fp16', 'none' or 'powersgd' for a job's `training.compression` on this placement."""
    if choice not in CHOICES:
        raise ValueError(f"compression must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice != "auto":
        return choice
    return "fp16" if on_gpu and nodes > 1 else "none"
