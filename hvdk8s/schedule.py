"""Learning-rate rules shared by the trainer and both framework adapters (pure arithmetic, no framework)."""
from __future__ import annotations

import math

LR_SCALING = ("linear", "sqrt", "none")


def lr_scale(rule: str, ranks: int, backward_passes_per_step: int = 1) -> float:
    """How much the learning rate grows with the global batch (ranks x accumulated passes)."""
    n = ranks * backward_passes_per_step
    if rule == "linear":
        return float(n)
    if rule == "sqrt":
        return math.sqrt(n)
    if rule == "none":
        return 1.0
    raise ValueError(f"lr_scaling must be one of {', '.join(LR_SCALING)}, got {rule!r}")


def warmup_lr(step: int, warmup_steps: int, base: float, peak: float) -> float:
    """Linear ramp from `base` to `peak` over the first `warmup_steps` optimizer steps (Goyal et al. 2017)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return peak
    return base + (peak - base) * (step + 1) / warmup_steps
