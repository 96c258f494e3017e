"""Users' own models and datasets named by import path in a job file (`model.factory`,
`dataset.factory`): imported, called and checked here, so a wrong path or a wrong result is a job-file
error naming the field (at `hvdk8s validate`, before any rank starts), never a traceback in a rank.

Factories are imported with the job file's folder first on sys.path (as Python puts a script's own
folder first), so `my_pkg/` beside the job file is found.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from hvdk8s.core.errors import UserError

# What a model factory may take from the dataset to size itself (passed only if it accepts them).
DATASET_INFO_KEYS = ("input_shape", "num_classes", "vocab_size", "seq_len")


class FactoryError(UserError):
    """A factory that cannot be imported or called, or returned the wrong thing; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__("invalid job file", [(field, message)])
        self.field, self.message = field, message


@contextlib.contextmanager
def importable_from(folder: Optional[Path]) -> Iterator[None]:
    """Put `folder` (the job file's) first on sys.path for the duration."""
    if folder is None:
        yield
        return
    entry = str(Path(folder).resolve())
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def _describe(e: BaseException) -> str:
    """The exception and the user's frame it came from: enough to find the line, without a traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def resolve(path: str, field: str) -> Callable:
    """The callable at 'package.module:attr.attr'."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise FactoryError(field, f"no module named {e.name!r} (looked in the job file's folder and "
                                      "PYTHONPATH)") from None
        raise FactoryError(field, f"importing {module_name!r} failed: {_describe(e)}") from None
    except Exception as e:  # the user's module raised on import (SyntaxError, ImportError inside, ...)
        raise FactoryError(field, f"importing {module_name!r} failed: {_describe(e)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FactoryError(field, f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(field, f"{path!r} is a {type(obj).__name__}, not a function or class")
    return obj


def _parameters(factory: Callable) -> dict[str, inspect.Parameter]:
    """The factory's parameters by name; none known for callables without a signature (some builtins)."""
    try:
        return dict(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return {}


def call(factory: Callable, field: str, args: dict[str, Any], extra: Optional[dict[str, Any]] = None) -> Any:
    """factory(**args, **the `extra` keywords it accepts); its exceptions become FactoryErrors."""
    kwargs = dict(args)
    if extra:
        params = _parameters(factory)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        kwargs.update({k: v for k, v in extra.items() if (takes_any or k in params) and k not in kwargs})
    try:
        return factory(**kwargs)
    except Exception as e:
        raise FactoryError(field, f"calling it with {sorted(kwargs)} failed: {_describe(e)}") from None


def _unknown_info(factory: Callable, given: set[str]) -> list[str]:
    """Dataset facts (num_classes, ...) that `factory` requires and neither model.args nor the data gives."""
    return [p.name for p in _parameters(factory).values() if p.name in DATASET_INFO_KEYS and p.name not in given
            and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def build_model(model_spec, framework: str, dataset_info: dict[str, Any]):
    """The user's model from `model.factory`, checked to be a model of the job's framework."""
    factory = resolve(model_spec.factory, "model.factory")
    missing = _unknown_info(factory, set(model_spec.args) | set(dataset_info))
    if missing:
        # A map-style dataset's first sample shows its input shape, not how many classes there are.
        raise FactoryError("model.factory", f"needs {', '.join(missing)}, which the dataset does not tell: give "
                                            "it in model.args, or have the dataset carry it (a map-style dataset's "
                                            "`classes` or `targets` attribute, or an `info` dict)")
    model = call(factory, "model.factory", model_spec.args,
                 {k: dataset_info[k] for k in DATASET_INFO_KEYS if k in dataset_info})
    if framework == "pytorch":
        import torch

        ok, wanted = isinstance(model, torch.nn.Module), "a torch.nn.Module"
    else:
        import keras

        ok, wanted = isinstance(model, keras.Model), "a keras.Model"
    if not ok:
        raise FactoryError("model.factory", f"returned {type(model).__name__}, not {wanted} "
                                            f"(framework: {framework})")
    return model


def dataset_splits(dataset_spec) -> dict[str, Any]:
    """{"train", "test"} for a job file's `dataset`: the user's `dataset.factory` imported and called here
    (FactoryError naming the field), any other kind opened by the data layer."""
    from hvdk8s.data import datasets  # here, not above: NumPy's import (0.13 CPU-s) is no `hvdk8s validate`'s

    if dataset_spec.factory is None:
        return datasets.open_splits(dataset_spec)
    field = "dataset.factory"
    result = call(resolve(dataset_spec.factory, field), field, dataset_spec.args)
    try:
        return datasets.splits_of(result, dataset_spec.test_fraction)
    except (TypeError, ValueError) as e:
        raise FactoryError(field, f"returned an unusable dataset: {e}") from None
