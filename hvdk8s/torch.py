"""Horovod for PyTorch, the part users import in their own training scripts.

    import hvdk8s.torch as ht
    ht.init()                                   # threads per rank on CPU, or the GPU of the local rank
    model, optimizer = build()                  # as usual
    optimizer = ht.distribute(model, optimizer) # rank 0's state everywhere; averaged (fp16-compressed
                                                # where that pays) gradients
    ...
    acc = ht.metric_average(local_acc)          # same value on every rank
    ht.log("epoch", epoch, acc)                 # printed by rank 0 only

A thin layer over `horovod.torch`: everything Horovod's DistributedOptimizer takes is passed through.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import horovod.torch as hvd
import torch

from hvdk8s import compression as _compression

rank, size, local_rank, local_size, cross_size = hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_size
Average, Sum = hvd.Average, hvd.Sum

_COMPRESSORS = {"fp16": hvd.Compression.fp16, "none": hvd.Compression.none}


def init(threads_per_rank: Optional[int] = None) -> None:
    """Start Horovod and give this rank its share of the machine.

    GPU: the device of the local rank. CPU: `threads_per_rank` intra-op threads (default: the cores
    divided among the ranks on this node, at least one), so N ranks do not fight over N*cores threads."""
    hvd.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        return
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already ran in this process
        pass


def is_rank0() -> bool:
    return hvd.rank() == 0


def log(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only, flushed at once (ranks' output is interleaved by the launcher)."""
    if hvd.rank() == 0:
        print(*args, **kwargs, flush=True)


def device() -> torch.device:
    return torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def resolve_compression(choice: str = "auto") -> str:
    """'fp16' or 'none': `auto` is fp16 only for GPU jobs that span more than one node."""
    return _compression.resolve(choice, on_gpu=torch.cuda.is_available(), nodes=hvd.cross_size())


def broadcast_state(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    root_rank: int = 0) -> None:
    """Make every rank hold root_rank's parameters, buffers and (if it has any) optimizer state.

    Horovod's broadcast_optimizer_state fills an empty state with a zero-gradient step, which moves
    parameters under weight decay; so it runs only when the root has state to share, and the
    parameters are broadcast after it."""
    if optimizer is not None:
        root_has_state = hvd.broadcast_object(bool(optimizer.state_dict()["state"]), root_rank,
                                              name="hvdk8s.optimizer_has_state")
        if root_has_state:
            hvd.broadcast_optimizer_state(optimizer, root_rank)
            optimizer.zero_grad()
    hvd.broadcast_parameters(model.state_dict(), root_rank)


def distribute(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, compression: str = "auto",
               backward_passes_per_step: int = 1, op=None, root_rank: int = 0,
               **horovod_options: Any) -> hvd.DistributedOptimizer:
    """Broadcast root_rank's state to all ranks and wrap `optimizer` so gradients are averaged.

    compression: 'auto' (default), 'fp16' or 'none'. Other keyword arguments (gradient_predivide_factor,
    sparse_as_dense, groups, num_groups, process_set) go to horovod.torch.DistributedOptimizer."""
    wrapped = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=_COMPRESSORS[resolve_compression(compression)],
        backward_passes_per_step=backward_passes_per_step, op=hvd.Average if op is None else op,
        **horovod_options)
    # Horovod builds a new optimizer from the param groups: carry over state restored from a checkpoint.
    if optimizer.state_dict()["state"]:
        wrapped.load_state_dict(optimizer.state_dict())
    broadcast_state(model, wrapped, root_rank)
    return wrapped


def allreduce(value, op=None, name: Optional[str] = None) -> torch.Tensor:
    """Allreduce a number or tensor (float64 for numbers, so sums of counts stay exact)."""
    t = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float64)
    return hvd.allreduce(t, op=hvd.Average if op is None else op, name=name)


def metric_average(value, name: Optional[str] = None) -> float:
    """The mean of a scalar metric over all ranks, the same on every rank."""
    return float(allreduce(value, hvd.Average, name))


def metric_sum(value, name: Optional[str] = None) -> float:
    return float(allreduce(value, hvd.Sum, name))


def save_checkpoint(directory: str, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra: Optional[dict] = None, keep: int = 3):
    """Rank 0 writes model, optimizer and `extra` for `epoch` atomically; other ranks do nothing.
    Returns the path on rank 0, None elsewhere."""
    from hvdk8s import checkpoint

    if hvd.rank() != 0:
        return None
    payload = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "extra": extra or {}}
    return checkpoint.save(directory, epoch, payload, lambda obj, path: torch.save(obj, path), keep)


def load_checkpoint(directory: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    root_rank: int = 0) -> tuple[int, dict]:
    """Resume from the newest valid checkpoint in `directory`, read by root_rank and broadcast (the
    directory need not be shared between nodes). Returns (epoch, extra) with extra["path"] the file read;
    (0, {}) when there is none.
    Call before `distribute` (which broadcasts the restored state) or call broadcast_state yourself."""
    from hvdk8s import checkpoint

    found = None
    if hvd.rank() == root_rank:
        found = checkpoint.load_latest(
            directory, lambda p: torch.load(p, map_location="cpu", weights_only=True),
            valid=lambda d: isinstance(d, dict) and {"epoch", "model", "optimizer"} <= d.keys())
    epoch, extra = 0, {}
    if found is not None:
        epoch, path, payload = found
        model.load_state_dict(payload["model"])
        if optimizer is not None:
            optimizer.load_state_dict(payload["optimizer"])
        extra = {**payload.get("extra", {}), "path": str(path)}
    return hvd.broadcast_object((epoch, extra), root_rank, name="hvdk8s.resume")
