"""An unchanged Horovod script whose rank `sys.argv[1]` raises once both ranks have met, while the other
waits for it in a collective (tests/test_first_failure.py, tests/test_cluster_logs.py)."""
import sys

import horovod.torch as hvd
import torch

hvd.init()
hvd.allreduce(torch.ones(1), name="both-up")
if hvd.rank() == int(sys.argv[1]):
    raise RuntimeError(f"boom on rank {hvd.rank()}")
hvd.allreduce(torch.ones(1), name="then")
