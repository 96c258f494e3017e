"""Datasets and rank-sharded loaders.

- `datasets`: the digits dataset, synthetic images and tokens, and a dataset on disk in the shard format.
- `shards`: writing and reading that format (shards of samples plus an index).
- `sharding`: which samples each rank reads, per epoch: disjoint, exactly once, reproducible.
- `torch`: loaders that turn a rank's plan into tensors.
"""
