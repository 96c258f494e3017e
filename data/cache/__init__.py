"""Node-local dataset cache: sync a dataset from its source (a local or NFS directory, an S3-compatible
object store, HTTP(S)) onto this node's disk before training, once per node, verified, resumable after
a crash, shared by the jobs on the node, evicted least recently used first.

    from hvdk8s.data.cache import sync, hold
    result = sync("s3://bucket/imagenet", "/var/cache/hvdk8s", quota_bytes=500 << 30, keep_hold=True)
    with result.hold as data_dir:  # held from inside the sync on: no eviction can come in between
        train(data_dir)

A process that did not sync holds a dataset with `hold(cache_root, key)` (as each rank does).
When the ranks start only after the syncing process has exited (a cluster's init container), the sync
leases the dataset instead: `sync(..., lease_seconds=1500)` keeps it from eviction, as if held, that long.

Layout, one directory per dataset key under the cache root: see `layout`. Source access and S3
settings: see `sources`. What a local source may hold (regular files, links to them): see `localtree`.
How long a source that stops answering is waited for: see `timeouts`.
"""
from .errors import CacheError
from .keys import dataset_key
from .published import write_manifest
from .store import CachedDataset, Hold, cached_path, evict, hold, leased_until, list_datasets
from .syncer import SyncResult, sync

__all__ = ["CacheError", "CachedDataset", "Hold", "SyncResult", "cached_path", "dataset_key", "evict", "hold",
           "leased_until", "list_datasets", "sync", "write_manifest"]
