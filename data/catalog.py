"""Built-in dataset names and their arguments. Pure data: importable without numpy-heavy work or a
framework, so job files validate anywhere."""
from __future__ import annotations

from pydantic import Field

from hvdk8s.core.strict import StrictModel


class _Args(StrictModel):
    """A built-in dataset's own arguments (a type of its own, so isinstance checks mean exactly that)."""


class DigitsArgs(_Args):
    """scikit-learn's 8x8 handwritten digits: 1,797 images, 10 classes, shipped with the package."""


class SyntheticImagesArgs(_Args):
    """Random images with learnable labels (a fixed random linear teacher), for benchmarks."""

    samples: int = Field(default=8192, gt=0, le=1 << 24)
    shape: list[int] = Field(default=[3, 32, 32], min_length=1, max_length=3)
    classes: int = Field(default=10, ge=2)


class SyntheticTokensArgs(_Args):
    """Random token sequences from a fixed random bigram table, for language-model benchmarks."""

    samples: int = Field(default=4096, gt=0, le=1 << 24)
    seq_len: int = Field(default=64, ge=2)
    vocab_size: int = Field(default=256, ge=2)


# name -> (argument model, task it feeds: "classification" or "language_model")
BUILTIN: dict[str, tuple[type[_Args], str]] = {
    "digits": (DigitsArgs, "classification"),
    "synthetic-images": (SyntheticImagesArgs, "classification"),
    "synthetic-tokens": (SyntheticTokensArgs, "language_model"),
}
