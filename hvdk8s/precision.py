"""The training precisions a job may ask for; each framework adapter maps them to its own mechanism
(torch autocast + GradScaler, Keras dtype policies + LossScaleOptimizer)."""
from __future__ import annotations

CHOICES = ("fp32", "bf16", "fp16")
