"""The hvdk8s shard format for users' own data.

A split is a directory holding `index.json` and shards `shard-00000.npz`, ... Each shard is an
uncompressed NumPy archive with the same arrays (`x`, `y`), first axis = samples. The index lists the
shards in order with their sample counts and SHA-256, plus the arrays' dtypes and per-sample shapes and
what the data feeds (`info`: input_shape and num_classes, or vocab_size and seq_len).

Readers stream shard by shard and keep at most four shards in memory.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hvdk8s.core.atomic import atomic_write
from hvdk8s.core.digest import sha256_file
from hvdk8s.core.errors import UserError

from .rankplans import epoch_rng

FORMAT = "hvdk8s-shards"
VERSION = 1
INDEX = "index.json"
# A batch spans at most two of the shard pairs that epoch_order mixes.
_SHARDS_IN_MEMORY = 4


class ShardFormatError(UserError, ValueError):
    """A shard directory that cannot be read; the message names the file."""

    def __init__(self, message: str):
        super().__init__(message)


def write_shards(directory: str | os.PathLike, arrays: Mapping[str, np.ndarray], *, samples_per_shard: int,
                 info: Mapping[str, Any]) -> Path:
    """Write `arrays` (same first dimension) as shards plus an index. The index is written last, under
    a temporary name renamed into place, so a directory with an index is always complete."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    n = {len(a) for a in arrays.values()}
    if len(n) != 1:
        raise ValueError("all arrays must have the same number of samples")
    total = n.pop()
    shards = []
    for i, start in enumerate(range(0, total, samples_per_shard)):
        name = f"shard-{i:05d}.npz"
        with open(out / name, "wb") as f:
            np.savez(f, **{k: a[start:start + samples_per_shard] for k, a in arrays.items()})
        shards.append({"file": name, "samples": min(samples_per_shard, total - start), "sha256": sha256_file(out / name)})
    index = {
        "format": FORMAT, "version": VERSION, "num_samples": total,
        "arrays": {k: {"dtype": str(a.dtype), "shape": list(a.shape[1:])} for k, a in arrays.items()},
        "info": dict(info), "shards": shards,
    }
    atomic_write(out / INDEX, json.dumps(index, indent=1, sort_keys=True))
    return out / INDEX


class ShardedDataset:
    """A split in the shard format, read lazily shard by shard.

    Its epoch order is a block shuffle: the shard order is permuted, then each pair of neighbouring
    shards is shuffled together. Each rank reads its run of shards front to back, a few at a time."""

    def __init__(self, directory: str | os.PathLike, *, verify: bool = False, storage_options: dict | None = None):
        # A local path, or any fsspec URL (s3://, https://): shards are then fetched whole, one at a time.
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        self.fs, root = fsspec.core.url_to_fs(str(directory), **(storage_options or {}))
        self.directory = Path(root) if isinstance(self.fs, LocalFileSystem) else None  # None: remote
        self._root = root.rstrip("/")
        index_path = f"{self._root}/{INDEX}"
        try:
            index = json.loads(self.fs.cat_file(index_path))
        except FileNotFoundError:
            raise ShardFormatError(f"{index_path}: no shard index here (write one with "
                                   "hvdk8s.data.shards.write_shards)") from None
        except json.JSONDecodeError as e:
            raise ShardFormatError(f"{index_path}: not valid JSON ({e})") from None
        if index.get("format") != FORMAT or index.get("version") != VERSION:
            raise ShardFormatError(f"{index_path}: not an {FORMAT} v{VERSION} index")
        self.index = index
        self.info = dict(index["info"])
        self.shards = index["shards"]
        self.offsets = np.cumsum([0] + [s["samples"] for s in self.shards])
        if self.offsets[-1] != index["num_samples"]:
            raise ShardFormatError(f"{index_path}: shard sample counts do not add up to num_samples")
        if verify:
            for s in self.shards:
                if hashlib.sha256(self.fs.cat_file(f"{self._root}/{s['file']}")).hexdigest() != s["sha256"]:
                    raise ShardFormatError(f"{self._root}/{s['file']}: checksum does not match the index")
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _shard(self, i: int) -> dict[str, np.ndarray]:
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        path = f"{self._root}/{self.shards[i]['file']}"
        try:
            source = path if self.directory is not None else io.BytesIO(self.fs.cat_file(path))
            with np.load(source) as z:
                data = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise ShardFormatError(f"{path}: cannot read shard ({e})") from None
        if len(next(iter(data.values()))) != self.shards[i]["samples"]:
            raise ShardFormatError(f"{path}: holds a different number of samples than the index says")
        self._cache[i] = data
        while len(self._cache) > _SHARDS_IN_MEMORY:
            self._cache.popitem(last=False)
        return data

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples by global index, in the order given, gathered one shard at a time."""
        indices = np.asarray(indices, dtype=np.int64)
        spec = self.index["arrays"]
        x = np.empty((len(indices), *spec["x"]["shape"]), spec["x"]["dtype"])
        y = np.empty((len(indices), *spec["y"]["shape"]), spec["y"]["dtype"])
        shard_of = np.searchsorted(self.offsets, indices, side="right") - 1
        for s in np.unique(shard_of):  # a batch spans a few shards: one gather from each
            rows = shard_of == s
            data = self._shard(int(s))
            local = indices[rows] - self.offsets[s]
            x[rows], y[rows] = data["x"][local], data["y"][local]
        return x, y

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        rng = epoch_rng(seed, epoch)
        blocks = [self.offsets[s] + rng.permutation(self.shards[s]["samples"])
                  for s in rng.permutation(len(self.shards))]
        # Mix neighbouring shards in pairs, so a batch draws from two shards rather than one while
        # reading stays shard-sequential: a batch no larger than a pair touches at most four shards.
        pairs = [np.concatenate(blocks[i:i + 2]) for i in range(0, len(blocks), 2)]
        for pair in pairs:
            rng.shuffle(pair)
        return np.concatenate(pairs) if pairs else np.empty(0, np.int64)

