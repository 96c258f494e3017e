"""Datasets and rank-sharded loaders.

- `catalog`: the built-in dataset names and their arguments (pure data: job files validate anywhere).
- `datasets`: datasets as (x, y) samples with a per-epoch order: the digits, synthetic images and tokens,
  a dataset on disk in the shard format (read from the node-local cache when it is cached), and what a
  user's factory returns; `open_splits` opens a job file's train and test splits.
- `shards`: the shard format, written and read (shards of samples plus an index).
- `rankplans`: which samples each rank reads, per epoch: disjoint, exactly once, reproducible.
- `torch`, `tensorflow`: loaders and `tf.data` pipelines that turn a rank's plan into tensors.
- `cache`: the node-local dataset cache (sync once per node, verified, resumable, shared, evicted LRU).
"""
