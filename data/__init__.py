"""Datasets and rank-sharded loaders.

- `catalog`: the built-in dataset names and their arguments (pure data: job files validate anywhere).
- `datasets`: the digits dataset, synthetic images and tokens, and a dataset on disk in the shard format.
- `shards`: writing and reading that format (shards of samples plus an index).
- `sharding`: which samples each rank reads, per epoch: disjoint, exactly once, reproducible.
- `torch`, `tensorflow`: loaders and `tf.data` pipelines that turn a rank's plan into tensors.
- `cache`: the node-local dataset cache (sync once per node, verified, resumable, shared, evicted LRU).
"""
