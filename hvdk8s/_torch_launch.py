"""A gradient's allreduce handed straight to Horovod's C++ queue, for hvdk8s.torch's optimizer.

Horovod's DistributedOptimizer launches each gradient's allreduce from its autograd hook through
`allreduce_async_`, whose Python work per call (the op's divisor, a ROCm check into the C library, the
tensor's type name looked up as a function name, argument checks) repeats the same answers for every
gradient of every step. Measured in a 2-rank ResNet-20 step on CPU (65 gradients): ~80 us of the
training thread's CPU per gradient, ~29 us of it the C++ enqueue, so ~3 ms a step (0.8%) of Python on
the critical path of backward; DDP's hooks are C++. `direct_launch` works those answers out once per
parameter and calls the same C++ function with the same arguments; anything off the common path
(no gradient, sparse, non-contiguous) goes through Horovod's own.

It and the optimizer's sleeping wait (hvdk8s.torch) use Horovod's private parts, so they run only on the
Horovod they were written against (HOROVOD_WRITTEN_FOR) and only after `self_check` found, on one tensor
at `distribute`, that they give what Horovod's own launch and wait give; `private_path` says why not
otherwise, and the optimizer keeps Horovod's public path.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import horovod
import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError
from horovod.torch import mpi_ops

from hvdk8s import tuning

HOROVOD_WRITTEN_FOR = "0.28.1"  # constraints.txt's: the private parts below are that release's
# What the launch uses of horovod.torch.mpi_ops beyond its public API.
_HOROVOD_INTERNALS = ("mpi_lib", "_handle_map", "_check_function", "_allreduce_function_factory", "_NULL",
                      "rocm_built")
_CHECK_NAME = "hvdk8s.self_check"


def private_path(optimizer) -> Optional[str]:
    """Why `optimizer` (a Horovod DistributedOptimizer) must keep Horovod's own launch and wait, or None
    where hvdk8s's may run, subject to `self_check`."""
    if horovod.__version__ != HOROVOD_WRITTEN_FOR:
        return f"Horovod {horovod.__version__} is not {HOROVOD_WRITTEN_FOR}, the release they were written for"
    missing = [name for name in _HOROVOD_INTERNALS if not hasattr(mpi_ops, name)]
    if missing or not isinstance(getattr(optimizer, "_handles", None), dict):
        return f"this Horovod lacks {', '.join(missing) or 'the optimizer._handles'} they use"
    if getattr(optimizer, "op", None) not in (hvd.Average, hvd.Sum) or mpi_ops.rocm_built():
        return "Horovod changes the divisor or the op for Adasum and ROCm"  # Adasum's optimizer has no `op`
    if tuning.elastic(os.environ):
        return "an elastic job: the self-check is a collective that a worker joining later would not match"
    return None


def direct_launch(optimizer) -> Callable:
    """A replacement for `optimizer._allreduce_grad_async` (which its hooks and synchronize() look up on the
    instance): the same C++ enqueue with the arguments worked out once per parameter."""
    horovod_launch = optimizer._allreduce_grad_async
    op = optimizer.op
    if op == hvd.Average:  # as Horovod splits an average around the predivide factor
        prescale, postscale = 1.0 / optimizer.gradient_predivide_factor, optimizer.gradient_predivide_factor
    else:
        prescale, postscale = 1.0, 1.0
    set_id, compress = optimizer.process_set.process_set_id, optimizer._compression.compress
    names: dict[torch.nn.Parameter, object] = {}  # bytes, or Horovod's own stand-in for no name
    enqueues: dict[tuple, Callable] = {}

    def launch(p: torch.nn.Parameter):
        grad = p.grad
        if grad is None or grad.is_sparse or not grad.is_contiguous():
            return horovod_launch(p)
        tensor, ctx = compress(grad)
        name = names.get(p)
        if name is None:
            given = optimizer._parameter_names.get(p)
            name = names[p] = mpi_ops._NULL if given is None else given.encode()
        key = (tensor.dtype, tensor.device.type)
        enqueue = enqueues.get(key)
        if enqueue is None:
            enqueue = enqueues[key] = getattr(mpi_ops.mpi_lib, mpi_ops._check_function(
                mpi_ops._allreduce_function_factory, tensor))
        try:
            handle = enqueue(tensor, tensor, 1, name, op, prescale, postscale, set_id)
        except RuntimeError as e:
            raise HorovodInternalError(e)
        mpi_ops._handle_map[handle] = (tensor, tensor)  # what synchronize() returns and keeps alive
        return handle, ctx

    return launch


def self_check(optimizer, launch: Callable, wait: Callable[[dict], None]) -> Optional[str]:
    """Why hvdk8s's `launch` and `wait` (the sleeping wait over a dict like optimizer._handles) may not
    replace Horovod's for `optimizer`, or None: one one-element gradient, on the device of the optimizer's
    parameters, allreduced through each of the two launches (a collective: every rank of the optimizer's process set calls this at `distribute`), hvdk8s's
    waited for by `wait`, both decompressed; their results must be equal, bit for bit."""
    if not optimizer.process_set.included():
        return None  # this rank never allreduces on that set: nothing to check, nothing to use
    # on the device the gradients live on: a GPU's tensors take Horovod's CUDA enqueue, not the CPU one
    device = next((p.device for group in optimizer.param_groups for p in group["params"]), torch.device("cpu"))
    probe = torch.nn.Parameter(torch.zeros(1, device=device))
    value = torch.tensor([float(hvd.rank() + 1) / 3.0], device=device)
    results = []
    for label, start in (("hvdk8s", launch), ("horovod", optimizer._allreduce_grad_async)):
        optimizer._parameter_names[probe] = f"{_CHECK_NAME}.{label}"
        probe.grad = value.clone()
        try:
            handle, ctx = start(probe)
            if label == "hvdk8s":
                wait({probe: (handle, ctx)})
                if not hvd.poll(handle):
                    return "their sleeping wait returned before the allreduce was done"
            results.append(optimizer._compression.decompress(hvd.synchronize(handle), ctx))
        except (TypeError, AttributeError, RuntimeError, HorovodInternalError) as e:
            return f"their self-check failed: {type(e).__name__}: {e}"
        finally:
            del optimizer._parameter_names[probe]
    if not torch.equal(results[0], results[1]):
        return (f"their self-check allreduced {results[0].tolist()} where Horovod's own path gave "
                f"{results[1].tolist()}")
    return None
