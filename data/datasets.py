"""Datasets as (x, y) sample arrays with a per-epoch order: built-ins in memory, users' data in shards
or from their own factory.

Every dataset offers `len()`, `take(indices) -> (x, y)`, `epoch_order(seed, epoch)` and `info`
(what the model needs to size itself: input_shape and num_classes, or vocab_size and seq_len).
`as_dataset` turns what a user's factory returns ((x, y) arrays, such an object, or any map-style
dataset with `__len__` and `__getitem__` -> (x, y), as torchvision's are) into one.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from .catalog import BUILTIN, SyntheticImagesArgs, SyntheticTokensArgs
from .rankplans import epoch_rng
from .shards import ShardedDataset

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


def _array(value: Any) -> np.ndarray:
    """A sample part as numpy (torch tensors, TF tensors, PIL images and lists all convert)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)


def _infer_info(x: np.ndarray, y: np.ndarray, labels: Optional[np.ndarray] = None) -> dict[str, Any]:
    """What a model needs to size itself, read off the samples: classifiers take (N, ...) inputs and
    integer labels; language models take token rows and next-token rows of the same shape."""
    if y.ndim == 2 and x.shape == y.shape and np.issubdtype(x.dtype, np.integer):
        return {"vocab_size": int(max(x.max(initial=0), y.max(initial=0))) + 1, "seq_len": int(x.shape[1])}
    info: dict[str, Any] = {"input_shape": list(x.shape[1:])}
    labels = y if labels is None else labels
    if labels is not None and len(labels) and np.issubdtype(labels.dtype, np.integer):
        info["num_classes"] = int(labels.max()) + 1
    return info


class MapDataset:
    """Any map-style dataset (`len(ds)`, `ds[i] -> (x, y)`) behind the hvdk8s dataset protocol:
    batches are the samples stacked, the epoch order a seeded permutation."""

    def __init__(self, source: Any, info: Optional[dict[str, Any]] = None):
        self.source = source
        x0, y0 = self._sample(0)
        self._empty = (np.zeros((0, *x0.shape), x0.dtype), np.zeros((0, *y0.shape), y0.dtype))
        if info is None:
            info = dict(getattr(source, "info", None) or {})
            if not info:
                classes = getattr(source, "classes", None)
                targets = getattr(source, "targets", None)
                info = _infer_info(x0[None], y0[None], _array(targets) if targets is not None else None)
                if classes is not None:
                    info["num_classes"] = len(classes)
                elif targets is None:
                    info.pop("num_classes", None)  # one sample says nothing about the number of classes
        self.info = info

    def _sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        item = self.source[int(i)]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"sample {i} is a {type(item).__name__}, not an (x, y) pair")
        return _array(item[0]), _array(item[1])

    def __len__(self) -> int:
        return len(self.source)

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(indices) == 0:
            return self._empty
        xs, ys = zip(*(self._sample(i) for i in indices))
        return np.stack(xs), np.stack(ys)

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return epoch_rng(seed, epoch).permutation(len(self))


class IndexSubset:
    """The samples of `base` at `indices`, in that order (a split of a dataset that has none)."""

    def __init__(self, base: Any, indices: np.ndarray):
        self.base, self.indices, self.info = base, np.asarray(indices), base.info

    def __len__(self) -> int:
        return len(self.indices)

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.base.take(self.indices[np.asarray(indices, dtype=np.int64)])

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return epoch_rng(seed, epoch).permutation(len(self))


def _is_protocol(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("take", "epoch_order", "info", "__len__"))


def as_dataset(obj: Any) -> Any:
    """A dataset in hvdk8s's protocol from (x, y) arrays, a protocol object or a map-style dataset.
    Raises TypeError or ValueError saying what is wrong with `obj`."""
    if _is_protocol(obj):
        ds = obj
    elif isinstance(obj, tuple) and len(obj) == 2:  # (x, y) arrays; a list is a map-style dataset
        x, y = _array(obj[0]), _array(obj[1])
        if x.ndim < 1 or y.ndim < 1 or len(x) != len(y):
            raise ValueError(f"(x, y) arrays must have one row per sample; got shapes {x.shape} and {y.shape}")
        ds = ArrayDataset(x, y, _infer_info(x, y))
    elif hasattr(obj, "__len__") and hasattr(obj, "__getitem__") and not isinstance(obj, (str, bytes, dict)):
        if len(obj) == 0:
            raise ValueError("the dataset is empty")
        ds = MapDataset(obj)
    else:
        raise TypeError(f"got {type(obj).__name__}; return (x, y) arrays, a map-style dataset "
                        "(__len__ and __getitem__ -> (x, y)) or {'train': ..., 'test': ...}")
    if len(ds) == 0:
        raise ValueError("the dataset is empty")
    return ds


def split(ds: Any, test_fraction: float) -> tuple[Any, Any]:
    """A fixed held-out split (the same for every seed, as for built-in data)."""
    if isinstance(ds, ArrayDataset):
        return train_test_split(ds, test_fraction)
    if len(ds) < 2:
        raise ValueError(f"{len(ds)} sample cannot be split into train and test; return {{'train': ..., 'test': ...}}")
    order = np.random.default_rng(_DATA_SEED).permutation(len(ds))
    n_test = min(len(ds) - 1, max(1, round(len(ds) * test_fraction)))
    return IndexSubset(ds, np.sort(order[n_test:])), IndexSubset(ds, np.sort(order[:n_test]))


def splits_of(result: Any, test_fraction: float) -> dict[str, Any]:
    """{"train", "test"} from what a user's dataset factory returned (hvdk8s.factories calls it and names the
    field when this raises TypeError or ValueError saying what is wrong with `result`)."""
    if isinstance(result, dict):
        if set(result) != {"train", "test"}:
            raise ValueError(f"a dict result needs exactly the keys 'train' and 'test', got {sorted(result)}")
        return {k: as_dataset(result[k]) for k in ("train", "test")}
    train, test = split(as_dataset(result), test_fraction)
    return {"train": train, "test": test}


def digits() -> ArrayDataset:
    """scikit-learn's 1,797 8x8 digit images as (N, 1, 8, 8) float32 in [0, 1], labels int64.

    Read from the data file scikit-learn ships (64 pixel values, then the label, per row) without
    importing scikit-learn, which costs every rank about 2 s of start-up."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # locates the package; runs none of it
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the digits dataset comes with scikit-learn: pip install 'hvdk8s[train]'")
    with gzip.open(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x = (table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    return ArrayDataset(x, table[:, 64].astype(np.int64), {"input_shape": [1, 8, 8], "num_classes": 10})


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
    from .cache import CacheError, cached_path  # here: ranks of datasets not cached never load the cache (rich)

    root = cache_root()
    path = cached_path(dataset_spec.path, root, dataset_spec.version)
    if path is None:
        raise CacheError(f"{dataset_spec.path} is not in the node-local cache {root}: run "
                         f"`hvdk8s cache sync {dataset_spec.path} {root}` first "
                         "(hvdk8s launch and the MPIJob's init container do this)")
    return path


@contextlib.contextmanager
def holding(dataset_spec) -> Iterator[None]:
    """While training, hold a cached dataset so that cache eviction leaves it alone."""
    if dataset_spec is None or dataset_spec.path is None or not dataset_spec.cached:
        yield
        return
    from .cache import dataset_key, hold  # as in dataset_root

    with hold(cache_root(), dataset_key(dataset_spec.path, dataset_spec.version)):
        yield


def last_sync(dataset_spec) -> Optional[dict]:
    """What this node's latest sync of a cached dataset found in place and copied (files_hit,
    files_missed, bytes_copied), or None."""
    if dataset_spec is None or dataset_spec.path is None or not dataset_spec.cached:
        return None
    from .cache import dataset_key  # as in dataset_root
    from .cache.layout import DatasetDir

    return DatasetDir(cache_root(), dataset_key(dataset_spec.path, dataset_spec.version)).read_last_sync()


def open_splits(dataset_spec) -> dict[str, Any]:
    """{"train": dataset, "test": dataset} for a job file's built-in or `path` dataset (a `factory` dataset's
    are `hvdk8s.factories.dataset_splits`', which imports the user's code: this floor runs none)."""
    if dataset_spec.name is not None:
        train, test = train_test_split(_builtin(dataset_spec.name, dataset_spec.args), dataset_spec.test_fraction)
        return {"train": train, "test": test}
    if dataset_spec.factory is not None:
        raise ValueError("a factory dataset is opened by hvdk8s.factories.dataset_splits")
    root = dataset_root(dataset_spec)
    return {split: ShardedDataset(root / sub) for split, sub in dataset_spec.splits.items()}
