"""Horovod for PyTorch, the part users import in their own training scripts.

    import hvdk8s.torch as ht
    ht.init()                                   # threads per rank on CPU, or the GPU of the local rank
    model, optimizer = build()                  # as usual
    optimizer = ht.distribute(model, optimizer) # rank 0's state everywhere; averaged (fp16-compressed
                                                # where that pays) gradients
    scaler = ht.grad_scaler(precision)          # fp16 only; None for fp32/bf16
    for x, y in loader:
        optimizer.zero_grad()
        with ht.autocast(precision):            # "fp32" | "bf16" | "fp16"
            loss = loss_fn(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        ht.step(optimizer, scaler=scaler, clip_grad_norm=1.0)
    acc = ht.metric_average(local_acc)          # same value on every rank
    ht.log("epoch", epoch, acc)                 # printed by rank 0 only

A thin layer over `horovod.torch`: everything Horovod's DistributedOptimizer takes is passed through.
The verbs in hvdk8s._adapter.CONTRACT have the same parameters as in `hvdk8s.tensorflow`.
"""
from __future__ import annotations

import contextlib
import copy
import sys
import time
from typing import Any, Optional

import horovod.torch as hvd
import horovod.torch.elastic  # noqa: F401  (hvd.elastic)
import torch
from horovod.common.elastic import ObjectState

from hvdk8s import (_adapter, checkpoint as _checkpoint, compression as _compression, metrics as _metrics,
                    precision as _precision)
from hvdk8s._adapter import CONTRACT
from hvdk8s import _torch_launch
from hvdk8s._torch_powersgd import PowerSGDOptimizer
from hvdk8s._torch_sharded import STAGES as SHARDING_STAGES, ShardedOptimizer
from hvdk8s._torch_wait import wait_asleep

rank, size, local_rank, local_size, cross_size = hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_size
Average, Sum = hvd.Average, hvd.Sum

_COMPRESSORS = {"fp16": hvd.Compression.fp16, "none": hvd.Compression.none}
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

__all__ = [*CONTRACT, "device", "share_cores", "autocast", "grad_scaler", "step"]


def init(threads_per_rank: Optional[int] = None) -> None:
    """Start Horovod and give this rank its share of the machine.

    GPU: the device of the local rank. CPU: `threads_per_rank` intra-op threads (default: the cores
    divided among the ranks on this node, at least one), so N ranks do not fight over N*cores threads."""
    _adapter.die_with_parent()
    on_gpu = torch.cuda.is_available()
    _adapter.start_horovod(hvd, gpus=on_gpu)  # the tuning profile a launcher did not give: hvdk8s/tuning.py
    if on_gpu:
        torch.cuda.set_device(hvd.local_rank())
        return
    share_cores(threads_per_rank)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already ran in this process
        pass


def share_cores(threads_per_rank: Optional[int] = None) -> None:
    """On CPU: this rank's intra-op threads, `threads_per_rank` or the node's cores divided among its ranks
    now (at least one). `init` calls it; an elastic job calls it again after its ranks change."""
    torch.set_num_threads(_adapter.cpu_threads(threads_per_rank, hvd.local_size()))


def is_rank0() -> bool:
    return hvd.rank() == 0


def log(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only, flushed at once (ranks' output is interleaved by the launcher)."""
    _adapter.rank0_print(hvd.rank(), *args, **kwargs)


def device() -> torch.device:
    return torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def resolve_compression(choice: str = "auto") -> str:
    """'fp16', 'none' or 'powersgd': `auto` is fp16 for jobs that span more than one node (hvdk8s.compression)."""
    return _compression.resolve(choice, nodes=hvd.cross_size())


def scaled_learning_rate(base: float, rule: str = "linear", backward_passes_per_step: int = 1) -> float:
    """`base` (the rate for one rank) grown with the global batch: ranks x backward_passes_per_step."""
    return _adapter.scaled_learning_rate(base, rule, hvd.size(), backward_passes_per_step)


def broadcast_state(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    root_rank: int = 0) -> None:
    """Make every rank hold root_rank's parameters, buffers and (if it has any) optimizer state.

    Horovod's broadcast_optimizer_state fills an empty state with a zero-gradient step, which moves
    parameters under weight decay; so it runs only when the root has state to share, and the
    parameters are broadcast after it. A rank alone has them already."""
    if _adapter.alone(hvd.size()):
        return
    if isinstance(optimizer, (ShardedOptimizer, PowerSGDOptimizer)):
        optimizer.sync(root_rank)  # its own format: root_rank's full state (the sharded: each rank keeps its part)
    elif optimizer is not None:
        root_has_state = hvd.broadcast_object(bool(optimizer.state_dict()["state"]), root_rank,
                                              name="hvdk8s.optimizer_has_state")
        if root_has_state:
            hvd.broadcast_optimizer_state(optimizer, root_rank)
            optimizer.zero_grad()
    hvd.broadcast_parameters(model.state_dict(), root_rank)


def distribute(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, compression: str = "auto",
               backward_passes_per_step: int = 1, op=None, root_rank: int = 0, broadcast: bool = True,
               shard_optimizer_state: int = 0, powersgd: Optional[dict] = None,
               **horovod_options: Any) -> torch.optim.Optimizer:
    """Broadcast root_rank's state to all ranks and wrap `optimizer` so gradients are averaged.
    broadcast=False skips the broadcast (elastic training: `ElasticState` syncs the ranks instead).

    compression: 'auto' (default), 'fp16', 'none' or 'powersgd' (low-rank factors with error feedback:
    hvdk8s._torch_powersgd; `powersgd` takes its settings: {"rank": 4, "start_step": 10,
    "min_compression_rate": 2.0}). backward_passes_per_step > 1 sums that many
    backward passes locally before one allreduce (scale each pass's loss by 1/passes for a mean).
    shard_optimizer_state: 0 (every rank holds the whole optimizer state), 1 (each rank holds and
    updates 1/N of it; ZeRO stage 1) or 2 (the gradients sharded too; ZeRO stage 2): see
    hvdk8s._torch_sharded. Other keyword arguments (gradient_predivide_factor, sparse_as_dense, groups,
    num_groups, process_set) go to horovod.torch.DistributedOptimizer (unsharded only)."""
    resolved = resolve_compression(compression)
    if powersgd is not None and resolved != "powersgd":
        raise ValueError("powersgd settings given, but compression is not 'powersgd'")
    if resolved == "powersgd":
        if shard_optimizer_state:
            raise ValueError("compression 'powersgd' and shard_optimizer_state: one or the other (a sharded "
                             "optimizer reduce-scatters whole gradients)")
        return _distribute_powersgd(model, optimizer, powersgd or {}, backward_passes_per_step=backward_passes_per_step,
                                    op=op, root_rank=root_rank, broadcast=broadcast, horovod_options=horovod_options)
    if shard_optimizer_state:
        return _distribute_sharded(model, optimizer, shard_optimizer_state, compression=compression,
                                   backward_passes_per_step=backward_passes_per_step, op=op, root_rank=root_rank,
                                   broadcast=broadcast, horovod_options=horovod_options)
    wrapped = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=_COMPRESSORS[resolve_compression(compression)],
        backward_passes_per_step=backward_passes_per_step, op=hvd.Average if op is None else op,
        **horovod_options)
    if _adapter.alone(hvd.size()):
        # One rank, for good: nothing to average. Horovod's step() would still send every gradient
        # through its background thread (it registers no hooks at size 1, so synchronize() allreduces
        # them all, after backward): 7-10% of a CPU step here (`hvdk8s bench --only wrapper`).
        wrapped.synchronize = _nothing_to_average
    else:
        _private_path(wrapped)
    # Horovod builds a new optimizer from the param groups: carry over state restored from a checkpoint.
    if optimizer.state_dict()["state"]:
        wrapped.load_state_dict(optimizer.state_dict())
    if broadcast:
        broadcast_state(model, wrapped, root_rank)
    return wrapped


def _distribute_sharded(model, optimizer, stage: int, *, compression: str, backward_passes_per_step: int, op,
                        root_rank: int, broadcast: bool, horovod_options: dict) -> ShardedOptimizer:
    if horovod_options:
        raise ValueError(f"shard_optimizer_state: Horovod's DistributedOptimizer options "
                         f"({', '.join(sorted(horovod_options))}) do not apply to a sharded optimizer")
    if stage not in SHARDING_STAGES:
        raise ValueError(f"shard_optimizer_state must be 0, 1 or 2, got {stage!r}")
    if isinstance(optimizer, ShardedOptimizer) or hasattr(optimizer, "_handles"):  # _handles: Horovod's
        raise ValueError("optimizer is already distributed")
    if broadcast:  # root_rank's parameters and whole state, before it is cut into shards
        broadcast_state(model, optimizer, root_rank)
    return ShardedOptimizer(optimizer, stage, backward_passes_per_step=backward_passes_per_step,
                            compression=resolve_compression(compression), op=op)


def _distribute_powersgd(model, optimizer, settings: dict, *, backward_passes_per_step: int, op, root_rank: int,
                         broadcast: bool, horovod_options: dict) -> PowerSGDOptimizer:
    if horovod_options:
        raise ValueError(f"compression 'powersgd': Horovod's DistributedOptimizer options "
                         f"({', '.join(sorted(horovod_options))}) do not apply to it")
    unknown = set(settings) - {"rank", "start_step", "min_compression_rate"}
    if unknown:
        raise ValueError(f"powersgd: unknown settings {', '.join(sorted(unknown))} (rank, start_step, "
                         "min_compression_rate)")
    if isinstance(optimizer, (ShardedOptimizer, PowerSGDOptimizer)) or hasattr(optimizer, "_handles"):
        raise ValueError("optimizer is already distributed")
    # backward passes sum into .grad on their own; the averaging happens once, at the step
    del backward_passes_per_step
    wrapped = PowerSGDOptimizer(optimizer, op=op, **settings)
    if broadcast:
        broadcast_state(model, wrapped, root_rank)
    return wrapped


def _nothing_to_average() -> None:
    pass


_fallbacks_logged: set[str] = set()


def _private_path(optimizer) -> None:
    """hvdk8s's direct gradient launch and sleeping wait for `optimizer` where this Horovod is the one they
    were written for and they pass the one-tensor self-check (hvdk8s._torch_launch); else Horovod's own,
    rank 0 saying why once per reason."""
    why = _torch_launch.private_path(optimizer)
    if why is None:
        launch = _torch_launch.direct_launch(optimizer)
        why = _torch_launch.self_check(optimizer, launch, _wait_asleep_for)
    if why is None:
        optimizer.synchronize = _timed(_waits_asleep(optimizer, optimizer.synchronize))
        optimizer._allreduce_grad_async = launch  # each gradient's allreduce straight to Horovod's C++ queue
        return
    optimizer.synchronize = _timed(optimizer.synchronize)
    if hvd.rank() == 0 and why not in _fallbacks_logged:
        _fallbacks_logged.add(why)
        print(f"hvdk8s: gradients take Horovod's own launch and wait, not hvdk8s's direct ones: {why}",
              file=sys.stderr, flush=True)


def _wait_asleep_for(handles: dict) -> None:
    """Until every allreduce of `handles` (as optimizer._handles: {parameter: (handle, ctx)}) is done
    (hvdk8s._torch_wait says why asleep)."""
    wait_asleep(handle for handle, _ in list(handles.values()))


def _waits_asleep(optimizer, synchronize):
    """synchronize(), after waiting asleep for every launched allreduce (hvdk8s._torch_wait says why);
    Horovod's synchronize() then finds them finished (and launches any a hook missed)."""
    def synchronize_asleep() -> None:
        _wait_asleep_for(optimizer._handles)
        synchronize()
    return synchronize_asleep


def _timed(synchronize):
    """Horovod's synchronize(), its wait counted in this rank's metrics (the allreduce share of a step)."""
    def timed_synchronize() -> None:
        began = time.perf_counter()
        synchronize()
        _metrics.current().allreduce_wait(time.perf_counter() - began)
    return timed_synchronize


def metrics(port: Optional[int] = None, job=None) -> _metrics.Metrics:
    """This rank's Prometheus metrics, served from the first call on (after `init()`): on when the job
    has them on (`observability.metrics`) or a `port` is given; else a Metrics that records nothing.

        m = ht.metrics()
        for epoch in ...:
            m.begin_epoch(epoch)
            for x, y in m.timed(loader):              # time waiting for data
                ...
                m.step(len(x), loss=loss.item)        # loss read at most once a second
    The allreduce wait of `distribute`'s optimizer is counted by itself."""
    return _adapter.metrics(hvd.rank(), hvd.local_rank(), hvd.local_size(), port, job)


# --- mixed precision and clipping ----------------------------------------------------------------

def _check_precision(precision: str) -> None:
    if precision not in _precision.CHOICES:
        raise ValueError(f"precision must be one of {', '.join(_precision.CHOICES)}, got {precision!r}")


def autocast(precision: str) -> contextlib.AbstractContextManager:
    """A context for the forward pass and loss: torch.autocast on this rank's device in bfloat16
    ("bf16") or float16 ("fp16"); nothing for "fp32". Parameters and gradients stay float32."""
    _check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device().type, dtype=_AUTOCAST_DTYPES[precision])


def grad_scaler(precision: str) -> Optional[torch.amp.GradScaler]:
    """A loss scaler for "fp16" (whose small gradients would underflow), on this rank's device type;
    None for "fp32" and "bf16" (bfloat16 has float32's range)."""
    _check_precision(precision)
    return torch.amp.GradScaler(device().type) if precision == "fp16" else None


def step(optimizer: torch.optim.Optimizer, *, scaler: Optional[torch.amp.GradScaler] = None,
         clip_grad_norm: Optional[float] = None) -> bool:
    """Finish one optimizer step after backward(); True if the parameters were updated.

    Unscaling and clipping must see the averaged gradients (so every rank clips by the same global
    norm and agrees on inf/nan), hence: wait for Horovod's allreduce, unscale, clip, then step without
    a second synchronization. With fp16, a step whose averaged gradients hold inf/nan is skipped on
    every rank (False) and the scale is lowered.

    Call it once per optimizer step: with backward_passes_per_step=k, after the k-th backward pass,
    not after each (an earlier call would allreduce a partial sum). `optimizer` may also be a plain
    torch optimizer (one process, no Horovod), or a sharded one (`distribute(shard_optimizer_state=)`),
    which unscales and clips its shards by the global norm and agrees on inf/nan through one allreduce."""
    if isinstance(optimizer, ShardedOptimizer):
        return optimizer.step_with(scaler=scaler, clip_grad_norm=clip_grad_norm)
    if scaler is None and clip_grad_norm is None:
        optimizer.step()  # Horovod's step() synchronizes by itself
        return True
    synchronize = getattr(optimizer, "synchronize", None)
    if synchronize is not None:
        synchronize()
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip_grad_norm is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
    no_sync = optimizer.skip_synchronize() if synchronize is not None else contextlib.nullcontext()
    with no_sync:
        if scaler is None:
            optimizer.step()
            return True
        scale = scaler.get_scale()
        scaler.step(optimizer)  # skips optimizer.step() if unscale_ found inf/nan
    scaler.update()
    # update() lowers the scale exactly when it found inf/nan (its backoff_factor < 1), so this tells
    # whether the step was skipped without reaching into GradScaler's private state.
    return scaler.get_scale() >= scale


# --- collectives ---------------------------------------------------------------------------------

def allreduce(value, op=None, name: Optional[str] = None) -> torch.Tensor:
    """Allreduce a number or tensor (float64 for numbers, so sums of counts stay exact). A rank alone gets
    a copy at once (any op of one value is that value) rather than waiting for Horovod's cycle."""
    t = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float64)
    if _adapter.alone(hvd.size()):
        return t.clone()
    return hvd.allreduce(t, op=hvd.Average if op is None else op, name=name)


def metric_average(value, name: Optional[str] = None) -> float:
    """The mean of a scalar metric over all ranks, the same on every rank."""
    return float(allreduce(value, hvd.Average, name))


def metric_sum(value, name: Optional[str] = None) -> float:
    return float(allreduce(value, hvd.Sum, name))


# --- checkpoints ---------------------------------------------------------------------------------

def save_checkpoint(directory: str, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra: Optional[dict] = None, keep: int = 3):
    """Rank 0 writes model, optimizer and `extra` for `epoch` atomically and keeps the `keep` newest;
    other ranks write nothing (with a sharded optimizer they send rank 0 their part of its state: call
    it on every rank). Returns the path on rank 0, None elsewhere."""
    # A sharded optimizer's state is gathered from every rank (collective), into the unsharded format;
    # PowerSGD's holds the ranks' mean error (collective too).
    sharded = optimizer.state_dict() if isinstance(optimizer, (ShardedOptimizer, PowerSGDOptimizer)) else None
    if hvd.rank() != 0:
        _metrics.current().checkpointed()  # rank 0 writes it now
        return None
    payload = {"epoch": epoch, "model": model.state_dict(),
               "optimizer": sharded if sharded is not None else optimizer.state_dict(), "extra": extra or {}}
    path = _checkpoint.save(directory, epoch, payload, lambda obj, path: torch.save(obj, path), keep)
    _metrics.current().checkpointed()
    return path


def _restorer(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer]):
    """A `valid` callback for checkpoint.load_latest that loads a payload into model and optimizer if it
    fits them, and returns False (leaving both untouched) for a checkpoint of another model."""

    def restore(payload) -> bool:
        if not (isinstance(payload, dict) and {"epoch", "model", "optimizer"} <= payload.keys()):
            return False
        here, saved = model.state_dict(), payload["model"]
        # Checked before loading: load_state_dict copies what fits before it raises for what does not.
        if saved.keys() != here.keys() or any(getattr(saved[k], "shape", None) != getattr(v, "shape", None)
                                              for k, v in here.items()):
            return False
        if optimizer is not None:
            try:  # validates the param groups before changing anything
                optimizer.load_state_dict(payload["optimizer"])
            except (ValueError, KeyError, TypeError, RuntimeError):
                return False
        model.load_state_dict(saved)
        return True

    return restore


def load_checkpoint(directory: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    root_rank: int = 0, broadcast: bool = True) -> tuple[int, dict]:
    """Resume from the newest checkpoint in `directory` that fits `model` (and `optimizer`), read by
    root_rank and broadcast (the directory need not be shared between nodes). Checkpoints that do not
    load or fit are skipped with a line on stderr. Returns (epoch, extra) with extra["path"] the file
    read; (0, {}) when there is none. Works before or after `distribute`. broadcast=False: no collective;
    root_rank alone reads and restores, the others get (0, {}) (elastic training: `ElasticState` syncs)."""
    found = None
    if hvd.rank() == root_rank:
        found = _checkpoint.load_latest(
            directory, lambda p: torch.load(p, map_location="cpu", weights_only=True),
            valid=_restorer(model, optimizer))
    epoch, extra = 0, {}
    if found is not None:
        epoch, path, payload = found
        extra = {**payload.get("extra", {}), "path": str(path)}
    if not broadcast or _adapter.alone(hvd.size()):
        return epoch, extra
    epoch, extra = hvd.broadcast_object((epoch, extra), root_rank, name="hvdk8s.resume")
    if epoch:
        broadcast_state(model, optimizer, root_rank)
    return epoch, extra


# --- elastic training ----------------------------------------------------------------------------

class ElasticState(ObjectState):
    """Horovod elastic state: the model, the optimizer and any other attributes (epoch=..., ...), kept
    in memory at each `commit()` and synced from rank 0 when workers join or leave (`run_elastic`).
    After a failure every rank goes back to the last commit. Like horovod.torch.elastic.TorchState, but
    the ranks are synced with `broadcast_state`, which never steps an optimizer that has no state yet."""

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, **attrs: Any):
        self._model, self._optimizer = model, optimizer
        self._saved = self._snapshot(first=True)
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **attrs)

    def _snapshot(self, first: bool = False) -> tuple:
        model = copy.deepcopy(self._model.state_dict())
        if isinstance(self._optimizer, ShardedOptimizer):
            # Its full state, gathered (collective: every rank commits at the same step) into host memory,
            # so that the ranks of a new world can take their parts from rank 0's. At construction, where a
            # joining worker must not wait for the others: what this rank loaded (rank 0's checkpoint).
            full = self._optimizer.loaded_state() if first else self._optimizer.state_dict()
            return model, None if full is None else _on_cpu(full)
        if isinstance(self._optimizer, PowerSGDOptimizer):  # its errors' mean: collective, except at construction
            return model, copy.deepcopy({**self._optimizer.inner.state_dict(),
                                         "powersgd": self._optimizer.compression_state(local=first)})
        return model, None if self._optimizer is None else copy.deepcopy(self._optimizer.state_dict())

    def save(self) -> None:
        self._saved = self._snapshot()
        super().save()

    def restore(self) -> None:
        model_state, optimizer_state = self._saved
        self._model.load_state_dict(model_state)
        if isinstance(self._optimizer, ShardedOptimizer):
            self._optimizer.drop_step()  # sync() re-shards rank 0's committed state for the new world
        elif self._optimizer is not None:
            self._optimizer.load_state_dict(optimizer_state)  # a distributed one also drops pending handles
            self._optimizer.zero_grad()  # gradients of the interrupted step
        super().restore()

    def reset(self) -> None:
        """After Horovod re-initialised for a new world, before any sync (Horovod skips the sync when
        workers only left): the committed state, which every rank holds, laid out for the new ranks."""
        if isinstance(self._optimizer, ShardedOptimizer):
            self._optimizer.reshard(self._saved[1])
        elif isinstance(self._optimizer, PowerSGDOptimizer):
            self._optimizer.reset_compression()  # the ranks that left took their errors with them

    def sync(self) -> None:
        if isinstance(self._optimizer, ShardedOptimizer):
            full = hvd.broadcast_object(self._saved[1] if hvd.rank() == 0 else None, 0, name="hvdk8s.zero.elastic")
            self._optimizer.reshard(full)
            broadcast_state(self._model)
        else:
            broadcast_state(self._model, self._optimizer)
        super().sync()


def _on_cpu(state_dict: dict) -> dict:
    """An optimizer state dict with its tensors in host memory (copies of any on a device)."""
    return {"state": {i: {k: v.cpu() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in s.items()}
                      for i, s in state_dict["state"].items()},
            "param_groups": copy.deepcopy(state_dict["param_groups"])}


def run_elastic(func):
    """Decorate `func(state, ...)`, the training to run under Horovod elastic: on a change of workers
    every rank re-initialises Horovod, calls the state's reset callbacks, syncs and calls `func` again.
    Nothing before it may be collective (a joining worker runs only this)."""
    return hvd.elastic.run(func)
