"""The model registry: names the job file may use, their arguments, and where each framework's
builder lives.

This module imports no framework, so a job file can be validated (and later rendered for a
cluster) on a machine that has neither torch nor TensorFlow. Builders are imported by dotted path
only when a model is actually built.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from hvdk8s.core.strict import StrictModel


class _Args(StrictModel):
    """A model's own arguments (a type of its own, so isinstance checks mean exactly that)."""


class MLPArgs(_Args):
    """Fully connected classifier over flattened inputs."""

    hidden: list[Annotated[int, Field(gt=0, le=1 << 20)]] = Field(default=[128, 64], max_length=64)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class CNNArgs(_Args):
    """Small convolutional classifier for small images (8x8 digits up to 32x32 CIFAR)."""

    channels: list[Annotated[int, Field(gt=0, le=1 << 16)]] = Field(default=[32, 64], min_length=1, max_length=16)
    hidden: int = Field(default=128, gt=0, le=1 << 16)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class ResNetArgs(_Args):
    """CIFAR-style ResNet (He et al. 2016, section 4.2): depth = 6n + 2, widths 16/32/64 x width."""

    depth: int = Field(default=20, ge=8)
    width: int = Field(default=1, ge=1)

    @field_validator("depth")
    @classmethod
    def _six_n_plus_two(cls, v: int) -> int:
        if (v - 2) % 6:
            raise ValueError(f"depth must be 6n+2 (8, 14, 20, 32, 44, 56, 110, ...), got {v}")
        return v


class TransformerArgs(_Args):
    """Decoder-only (causal) Transformer language model."""

    d_model: int = Field(default=128, gt=0, le=1 << 16)
    heads: int = Field(default=4, gt=0, le=1 << 16)
    layers: int = Field(default=2, gt=0, le=1 << 16)
    d_ff: int = Field(default=512, gt=0, le=1 << 16)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    max_len: int = Field(default=512, gt=0, le=1 << 16)

    @model_validator(mode="after")
    def _heads_divide(self) -> "TransformerArgs":
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self


@dataclass(frozen=True)
class ModelEntry:
    name: str
    args: type[_Args]
    task: str  # "classification" (inputs -> class logits) or "language_model" (tokens -> next-token logits)
    builders: dict[str, str]  # framework -> "module:function"

    def build(self, framework: str, args: dict[str, Any] | _Args, **dataset_info: Any):
        if framework not in self.builders:
            raise ValueError(f"model {self.name!r} has no {framework} builder "
                             f"(available: {', '.join(sorted(self.builders))})")
        module_name, func = self.builders[framework].split(":")
        parsed = args if isinstance(args, _Args) else self.args(**args)
        return getattr(importlib.import_module(module_name), func)(parsed, **dataset_info)


def _builders(name: str) -> dict[str, str]:
    return {"pytorch": f"hvdk8s.models.torch_models:build_{name}",
            "tensorflow": f"hvdk8s.models.tensorflow_models:build_{name}"}


REGISTRY: dict[str, ModelEntry] = {
    e.name: e
    for e in [
        ModelEntry("mlp", MLPArgs, "classification", _builders("mlp")),
        ModelEntry("cnn", CNNArgs, "classification", _builders("cnn")),
        ModelEntry("resnet", ResNetArgs, "classification", _builders("resnet")),
        ModelEntry("transformer", TransformerArgs, "language_model", _builders("transformer")),
    ]
}


def get(name: str) -> ModelEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None


def build(name: str, framework: str, args: dict[str, Any] | None = None, **dataset_info: Any):
    """Build model `name` for `framework` ("pytorch" or "tensorflow"), sized by the dataset
    (`input_shape` and `num_classes` for classifiers, `vocab_size` and `seq_len` for language models)."""
    return get(name).build(framework, args or {}, **dataset_info)
