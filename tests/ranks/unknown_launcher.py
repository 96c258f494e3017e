"""A rank of a 2-rank job whose launcher, unlike Open MPI's, does not tell the job's size in the
environment: hvdk8s takes it for a rank alone, and once Horovod says otherwise, says so on stderr."""
import os

os.environ.pop("OMPI_COMM_WORLD_SIZE", None)  # MPI still learns the size from its own wire-up (PMIx)

import hvdk8s.torch as ht  # noqa: E402

ht.init()
print(f"size {ht.size()}", flush=True)
