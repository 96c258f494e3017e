"""An unchanged Horovod script whose rank `sys.argv[1]` dies by SIGKILL (as the OOM killer ends a rank) once
both ranks have met: no Python error of its own, while the other gets a HorovodInternalError
(tests/test_first_failure.py)."""
import os
import signal
import sys

import horovod.torch as hvd
import torch

hvd.init()
hvd.allreduce(torch.ones(1), name="both-up")
if hvd.rank() == int(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGKILL)
hvd.allreduce(torch.ones(1), name="then")
