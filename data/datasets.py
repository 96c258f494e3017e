"""Datasets as (x, y) sample arrays with a per-epoch order: built-ins in memory, users' data in shards.

Every dataset offers `len()`, `take(indices) -> (x, y)`, `epoch_order(seed, epoch)` and `info`
(what the model needs to size itself: input_shape and num_classes, or vocab_size and seq_len).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .catalog import BUILTIN, SyntheticImagesArgs, SyntheticTokensArgs
from .sharding import epoch_rng
from .shards import ShardedDataset, ShardFormatError

# Built-in data is derived from a fixed seed, not the job's: changing the training seed must not
# change which samples are held out for testing.
_DATA_SEED = 20240917


@dataclass
class ArrayDataset:
    x: np.ndarray
    y: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.x)

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[indices], self.y[indices]

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return epoch_rng(seed, epoch).permutation(len(self))

    def subset(self, indices: np.ndarray) -> "ArrayDataset":
        return ArrayDataset(self.x[indices], self.y[indices], dict(self.info))


def digits() -> ArrayDataset:
    """scikit-learn's 1,797 8x8 digit images as (N, 1, 8, 8) float32 in [0, 1], labels int64."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    return ArrayDataset(x, bunch.target.astype(np.int64), {"input_shape": [1, 8, 8], "num_classes": 10})


def synthetic_images(args: SyntheticImagesArgs) -> ArrayDataset:
    """Gaussian images labelled by a fixed random linear teacher: learnable, any size, no download."""
    rng = np.random.default_rng(_DATA_SEED)
    x = rng.standard_normal((args.samples, *args.shape), dtype=np.float32)
    teacher = rng.standard_normal((int(np.prod(args.shape)), args.classes), dtype=np.float32)
    y = np.argmax(x.reshape(args.samples, -1) @ teacher, axis=1).astype(np.int64)
    return ArrayDataset(x, y, {"input_shape": list(args.shape), "num_classes": args.classes})


def synthetic_tokens(args: SyntheticTokensArgs) -> ArrayDataset:
    """Token sequences from a fixed random bigram model (each token has a few likely successors).
    x: tokens (N, seq_len) int64; y: the same sequences shifted by one (next-token targets)."""
    rng = np.random.default_rng(_DATA_SEED)
    v = args.vocab_size
    logits = rng.standard_normal((v, v)) * 3.0
    cum = np.cumsum(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), axis=1)
    tokens = np.empty((args.samples, args.seq_len + 1), np.int64)
    tokens[:, 0] = rng.integers(0, v, args.samples)
    for t in range(1, args.seq_len + 1):
        u = rng.random(args.samples)[:, None]
        tokens[:, t] = np.minimum((cum[tokens[:, t - 1]] < u).sum(axis=1), v - 1)
    return ArrayDataset(tokens[:, :-1].copy(), tokens[:, 1:].copy(),
                        {"vocab_size": v, "seq_len": args.seq_len})


def _builtin(name: str, args: dict[str, Any]) -> ArrayDataset:
    args_model = BUILTIN[name][0](**args)
    if name == "digits":
        return digits()
    if name == "synthetic-images":
        return synthetic_images(args_model)
    return synthetic_tokens(args_model)


def train_test_split(ds: ArrayDataset, test_fraction: float) -> tuple[ArrayDataset, ArrayDataset]:
    order = np.random.default_rng(_DATA_SEED).permutation(len(ds))
    n_test = max(1, round(len(ds) * test_fraction))
    return ds.subset(np.sort(order[n_test:])), ds.subset(np.sort(order[:n_test]))


def cache_root() -> Path:
    """The node-local dataset cache: $HVDK8S_CACHE_DIR (set in cluster pods), else ~/.cache/hvdk8s/datasets."""
    return Path(os.environ.get("HVDK8S_CACHE_DIR") or Path.home() / ".cache" / "hvdk8s" / "datasets")


def storage_options(dataset_spec) -> dict[str, Any]:
    """fsspec options for the dataset's source (credentials come from the environment)."""
    if dataset_spec.path.startswith("s3://") and dataset_spec.s3.endpoint_url:
        return {"client_kwargs": {"endpoint_url": dataset_spec.s3.endpoint_url}}
    return {}


def dataset_root(dataset_spec) -> Path:
    """Where a `path` dataset is read from: the node-local copy when it is cached, else the path itself."""
    if not dataset_spec.cached:
        return Path(dataset_spec.path.removeprefix("file://"))
    from .cache import cached_path

    root = cache_root()
    path = cached_path(dataset_spec.path, root, dataset_spec.version)
    if path is None:
        raise ShardFormatError(f"{dataset_spec.path} is not in the node-local cache {root}: run "
                               f"`hvdk8s cache sync {dataset_spec.path} {root}` first "
                               "(hvdk8s launch and the MPIJob's init container do this)")
    return path


@contextlib.contextmanager
def holding(dataset_spec) -> Iterator[None]:
    """While training, hold a cached dataset so that cache eviction leaves it alone."""
    if dataset_spec.path is None or not dataset_spec.cached:
        yield
        return
    from .cache import dataset_key, hold

    with hold(cache_root(), dataset_key(dataset_spec.path, dataset_spec.version)):
        yield


def open_splits(dataset_spec) -> dict[str, Any]:
    """{"train": dataset, "test": dataset} for a job file's `dataset` section."""
    if dataset_spec.name is not None:
        train, test = train_test_split(_builtin(dataset_spec.name, dataset_spec.args), dataset_spec.test_fraction)
        return {"train": train, "test": test}
    root = dataset_root(dataset_spec)
    return {split: ShardedDataset(root / sub) for split, sub in dataset_spec.splits.items()}
