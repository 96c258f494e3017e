"""Node-local dataset cache: sync a dataset from its source (a local or NFS directory, an S3-compatible
object store, HTTP(S)) onto this node's disk before training, once per node, verified, resumable after
a crash, shared by the jobs on the node, evicted least recently used first.

    from hvdk8s.data.cache import sync, hold
    result = sync("s3://bucket/imagenet", "/var/cache/hvdk8s", quota_bytes=500 << 30)
    with hold("/var/cache/hvdk8s", result.key) as data_dir:
        train(data_dir)

Layout, one directory per dataset key under the cache root: see `layout`. Source access and S3
settings: see `sources`.
"""
from .errors import CacheError
from .keys import dataset_key
from .published import write_manifest
from .store import CachedDataset, cached_path, evict, hold, list_datasets
from .syncer import SyncResult, sync

__all__ = ["CacheError", "CachedDataset", "SyncResult", "cached_path", "dataset_key", "evict", "hold",
           "list_datasets", "sync", "write_manifest"]
