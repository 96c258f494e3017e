"""Runs on 2 real Horovod ranks (run by tests/test_tuning_profile.py): `private_path.py OUT MODE...` distributes
an optimizer once per MODE, in one launch (each start costs seconds), MODE simulating what should send it
to Horovod's public path:
  as-written  nothing: hvdk8s's direct launch and sleeping wait run
  version     another Horovod release than the one they were written for
  self-check  a direct launch whose result differs from Horovod's (it doubles the gradient it enqueues)
  signature   a Horovod whose C enqueue functions have the same names and another signature (one more
              argument): the direct launch's call raises TypeError, Horovod's own path is unchanged
  late-wait   a sleeping wait that returns before the allreduce is done
Before each, rank 0 writes `MODE <mode>` on stderr (where hvdk8s says why it falls back), and each mode's
simulation is undone after it. Writes OUT/rank<r>.json: {mode: which path the optimizer took, and whether
one step's averaged gradients equal the mean of both ranks' own}."""
import copy
import json
import sys
import types
from pathlib import Path

import torch

import hvdk8s.torch as ht
from hvdk8s import _torch_launch

out, modes = Path(sys.argv[1]), sys.argv[2:]
ht.init()
rank = ht.rank()
written_for, written_launch, written_wait, real_poll = (_torch_launch.HOROVOD_WRITTEN_FOR, _torch_launch.direct_launch,
                                                        ht._wait_asleep_for, ht.hvd.poll)
real_mpi_ops = _torch_launch.mpi_ops


class OtherSignatures:
    """Horovod's C library as a later release might have it: each function wants one more argument."""

    def __getattr__(self, name):
        real = getattr(real_mpi_ops.mpi_lib, name)

        def enqueue(tensor, output, divisor, name, op, prescale, postscale, process_set_id, priority):
            return real(tensor, output, divisor, name, op, prescale, postscale, process_set_id)
        return enqueue


def doubling(optimizer):
    launch = written_launch(optimizer)

    def launch_doubled(p):
        p.grad.mul_(2.0)
        return launch(p)
    return launch_doubled


def simulate(mode: str) -> None:
    if mode == "version":
        _torch_launch.HOROVOD_WRITTEN_FOR = "0.0.0"
    elif mode == "self-check":
        _torch_launch.direct_launch = doubling
    elif mode == "signature":  # seen by hvdk8s's launch only: Horovod's own module keeps its library
        _torch_launch.mpi_ops = types.SimpleNamespace(**vars(real_mpi_ops))
        _torch_launch.mpi_ops.mpi_lib = OtherSignatures()
    elif mode == "late-wait":
        ht._wait_asleep_for = lambda handles: None
        ht.hvd.poll = lambda handle: False  # what a wait that returned at once may find: not done yet


def undo() -> None:
    _torch_launch.HOROVOD_WRITTEN_FOR, _torch_launch.direct_launch = written_for, written_launch
    ht._wait_asleep_for, ht.hvd.poll = written_wait, real_poll
    _torch_launch.mpi_ops = real_mpi_ops


def one_step(mode: str) -> dict:
    if rank == 0:
        sys.stderr.write(f"MODE {mode}\n")  # one write: mpirun tags each write of an unbuffered stream
        sys.stderr.flush()
    simulate(mode)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    reference = copy.deepcopy(model)  # without Horovod's hooks: each rank's own gradient, on every rank
    optimizer = ht.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))
    direct = optimizer._allreduce_grad_async.__name__ in ("launch", "launch_doubled")
    ht.hvd.poll = real_poll  # (late-wait: only distribute's self-check was to find it not done)
    inputs = [torch.full((1, 4), float(r + 1)) for r in range(2)]
    grads = []
    for r in range(2):
        reference.zero_grad()
        reference(inputs[r]).sum().backward()
        grads.append(reference.weight.grad.clone())
    optimizer.zero_grad()
    model(inputs[rank]).sum().backward()
    optimizer.synchronize()
    averaged = torch.equal(model.weight.grad, (grads[0] + grads[1]) / 2)
    undo()
    return {"direct": direct, "averaged": averaged}


(out / f"rank{rank}.json").write_text(json.dumps({mode: one_step(mode) for mode in modes}))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
