"""A rank of a 2-rank job whose launcher, unlike Open MPI's, does not tell the job's size in the
environment: hvdk8s takes it for a rank alone, and once Horovod says otherwise, says so on stderr."""
import os

os.environ.pop("OMPI_COMM_WORLD_SIZE", None)  # MPI still learns the size from its own wire-up (PMIx)
for name in ("HVDK8S_TUNING", "HOROVOD_CYCLE_TIME"):  # nor is it hvdk8s's launcher, which applies the profile
    os.environ.pop(name, None)

import hvdk8s.torch as ht  # noqa: E402

ht.init()
print(f"size {ht.size()}", flush=True)
