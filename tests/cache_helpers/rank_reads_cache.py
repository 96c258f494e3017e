"""A rank of a job's own script: after a pause (the window in which another job's eviction once removed
the dataset), it holds the cached dataset as hvdk8s's trainer does and reads a file from it."""
import time

import hvdk8s
from hvdk8s.data.datasets import dataset_root, holding

spec = hvdk8s.job()
time.sleep(1.0)
with holding(spec.dataset):
    print(f"read {len((dataset_root(spec.dataset) / 'a.bin').read_bytes())} bytes", flush=True)
