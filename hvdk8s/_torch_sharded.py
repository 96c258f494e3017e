"""Optimizer state sharded across ranks (ZeRO stages 1 and 2) over Horovod, for hvdk8s.torch.

`ht.distribute(model, optimizer, shard_optimizer_state=1 or 2)` returns a `ShardedOptimizer`.

Layout. The parameters of each param group are packed, in order, into chunks of about CHUNK_BYTES (one
dtype and device each); each parameter becomes a view of its chunk's flat buffer, padded to a multiple
of the rank count. Rank r owns slice r of every chunk: shards are equal to the element (byte-balanced
whatever the tensor sizes; a tensor may be split between ranks), the padding is under one element per
rank per chunk. The user's optimizer is copied onto the slices (one flat tensor per chunk, the group's
hyperparameters kept), so it holds state for 1/N of the parameters; any optimizer whose update is
element-wise (SGD with momentum, Adam, AdamW, RMSprop, Adagrad, a user's own such) gives the update it
would give unsharded. One that reads a tensor's shape or norm (LAMB, LARS, Adafactor) sees flat slices.

A step. Each chunk's gradients are reduce-scattered (averaged, rank r receiving slice r) as soon as
backward has produced all of them (post-accumulate-grad hooks), so communication overlaps backward as
Horovod's allreduce does. Stage 1 launches once per optimizer step, after the last of
backward_passes_per_step passes, and leaves the parameters' .grad in place (this rank's own gradients).
Stage 2 launches after every backward pass, adds the result to the slice's gradient and frees the
parameters' .grad at once: a rank keeps only its gradient shard. Then (`step`) the slices' gradients are
unscaled and clipped (the global norm and the fp16 overflow check from one allreduce of the shards'
squared norms, so every rank agrees), the inner optimizer updates the slices, and every chunk is
allgathered back into the parameters. Communication per step: a reduce-scatter and an allgather, as much
as one allreduce (stage 2: a reduce-scatter per backward pass). On CPU, where Horovod 0.28's
reduce-scatter and allgather cost far more (`_on_cpu`), a chunk is allreduced in place instead and the
rank copies its slice out (the same bytes kept after the step), and the updated slices go back by
broadcasts in place from their owners.

Checkpoints: `state_dict()` gathers the full state in the format of the unsharded optimizer (every rank
must call it: it is collective) and `load_state_dict()` takes that format and keeps this rank's part, so
a job resumes at another rank count, or with sharding turned on or off (docs/sharded-optimizer.md).
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import math
import time
from collections import defaultdict
from typing import Any, Optional

import horovod.torch as hvd
import torch

from hvdk8s import metrics as _metrics
from hvdk8s._torch_wait import wait_asleep

STAGES = (1, 2)
CHUNK_BYTES = 4 << 20  # per reduce-scatter: small enough to start during backward, big enough to stream
GATHER_WINDOW_BYTES = 64 << 20  # allgather outputs in flight at once: bounds the step's transient memory
_names = itertools.count()


class _Chunk:
    """Consecutive parameters of one param group, dtype and device, packed into one padded flat buffer."""

    def __init__(self, group: int, params: list[torch.nn.Parameter], size: int, rank: int, name: str):
        self.group, self.params, self.name = group, params, name
        self.numel = sum(p.numel() for p in params)
        self.slice_len = -(-self.numel // size)
        first = params[0]
        self.flat = torch.zeros(self.slice_len * size, dtype=first.dtype, device=first.device)
        self.offsets = []
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
                p.data = self.flat[offset:offset + n].view_as(p)
                self.offsets.append(offset)
                offset += n
        self.shard = self.flat[rank * self.slice_len:(rank + 1) * self.slice_len]  # the inner optimizer's
        self.new_step()

    def new_step(self) -> None:
        self.counts = dict.fromkeys(self.params, 0)  # backward passes seen this step, per parameter
        self.ready = 0       # parameters that have seen the passes the next launch needs
        self.launched = 0    # reduce-scatters launched this step
        self.pending: list[tuple[Optional[int], torch.Tensor]] = []  # (handle, what it reduces)

    def grads_flat(self, dtype: torch.dtype) -> torch.Tensor:
        """The parameters' gradients as one padded flat tensor (zeros where a parameter has none)."""
        parts = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                 for p in self.params]
        pad = self.flat.numel() - self.numel
        if pad:
            parts.append(torch.zeros(pad, dtype=self.flat.dtype, device=self.flat.device))
        return torch.cat(parts).to(dtype)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A full flat tensor of this chunk cut back into one tensor per parameter (views)."""
        return [flat[o:o + p.numel()].view(p.shape) for o, p in zip(self.offsets, self.params)]


def _on_cpu(t: torch.Tensor) -> bool:
    """Whether a chunk goes through the collectives measured fastest on CPU: its gradients allreduced in
    place (this rank's slice copied out) instead of reduce-scattered, its updated slices broadcast in
    place from their owners instead of allgathered. At 2 ranks on one host (2026-12-05, 28 chunks of 4
    MiB, medians of 6): reduce-scatter 226-244 ms against the allreduce's 140-167; allgather and copy
    96-153 ms against the broadcasts' 28-34. GPU chunks keep the reduce-scatter and the allgather
    (NCCL's), never measured against these."""
    return t.device.type == "cpu"


def _hyperparameters(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class ShardedOptimizer(torch.optim.Optimizer):
    """A data-parallel optimizer whose state (stage 1), and gradients (stage 2), are sharded across ranks.

    `param_groups` are the original optimizer's (set the learning rate there, as usual);
    `state_dict()`/`load_state_dict()` use the unsharded format. `step()` must be called on every rank;
    `ht.step(optimizer, scaler=..., clip_grad_norm=...)` adds loss scaling and clipping."""

    def __init__(self, optimizer: torch.optim.Optimizer, stage: int, *, backward_passes_per_step: int = 1,
                 compression: str = "none", op=None):
        if stage not in STAGES:
            raise ValueError(f"shard_optimizer_state must be 0, 1 or 2, got {stage!r}")
        if op not in (None, hvd.Average, hvd.Sum):
            raise ValueError("a sharded optimizer averages or sums gradients (op=ht.Average or ht.Sum), "
                             "not Adasum")
        self.stage, self.passes = stage, backward_passes_per_step
        self.op = hvd.Average if op is None else op
        self._wire_dtype = torch.float16 if compression == "fp16" else None
        self._loaded: Optional[dict] = None  # the last full state loaded, until the ranks are synced
        self._prefix = f"hvdk8s.zero{next(_names)}"
        full_state = optimizer.state_dict()
        # The user's optimizer, copied onto this rank's slices (by _lay_out): same class, settings, hooks.
        self.inner = copy.copy(optimizer)
        self.inner.state = defaultdict(dict)
        super().__init__(optimizer.param_groups, optimizer.defaults)  # the same group dicts: one lr to set
        self._hooks: list = []
        self._lay_out()
        optimizer.state.clear()  # the full state now lives, sharded, in the slices
        self.load_state_dict(full_state)
        self._loaded = None

    def _lay_out(self) -> None:
        """Chunks, this rank's slices, the inner optimizer's groups and the gradient hooks, for the ranks
        there are now. The inner optimizer starts without state."""
        for hook in self._hooks:
            hook.remove()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.chunks: list[_Chunk] = []
        for gi, group in enumerate(self.param_groups):
            run: list[torch.nn.Parameter] = []
            run_bytes = 0
            for p in [p for p in group["params"] if p.requires_grad]:  # frozen ones stay out, as torch skips them
                if run and ((p.dtype, p.device) != (run[0].dtype, run[0].device) or run_bytes >= CHUNK_BYTES):
                    self.chunks.append(_Chunk(gi, run, self.size, self.rank, f"{self._prefix}.{len(self.chunks)}"))
                    run, run_bytes = [], 0
                run.append(p)
                run_bytes += p.numel() * p.element_size()
            if run:
                self.chunks.append(_Chunk(gi, run, self.size, self.rank, f"{self._prefix}.{len(self.chunks)}"))
        self.inner.state = defaultdict(dict)
        self.inner.param_groups = []
        for gi, group in enumerate(self.param_groups):
            self.inner.add_param_group({**_hyperparameters(group),
                                        "params": [c.shard for c in self.chunks if c.group == gi]})
        self._chunk_of = {p: c for c in self.chunks for p in c.params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for c in self.chunks for p in c.params]
        self._overrun = False

    def reshard(self, full_state: Optional[dict]) -> None:
        """Lay the shards out again for the ranks there are now (after an elastic change of workers) and
        take this rank's part of `full_state` (the unsharded format; None: no state yet). Local: no
        collective."""
        self._lay_out()
        if full_state is not None:
            self.load_state_dict(full_state)
        self._loaded = None

    # --- gradients -----------------------------------------------------------------------------

    @property
    def _launches_per_step(self) -> int:
        return self.passes if self.stage == 2 else 1

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        c = self._chunk_of[p]
        c.counts[p] += 1
        if c.launched >= self._launches_per_step:
            self._overrun = True  # more backward passes than backward_passes_per_step: step() says so
            return
        need = (c.launched + 1) * (1 if self.stage == 2 else self.passes)
        if c.counts[p] == need:
            c.ready += 1
            if c.ready == len(c.params):
                self._launch(c)

    def _launch(self, c: _Chunk) -> None:
        """Reduce-scatter the chunk's gradients as they are now; stage 2 then drops them."""
        send = c.grads_flat(self._wire_dtype or c.flat.dtype)
        name = f"{c.name}.{c.launched}"
        c.launched += 1
        need = (c.launched + 1) * (1 if self.stage == 2 else self.passes)
        c.ready = sum(n >= need for n in c.counts.values())
        if self.size == 1:
            handle = None
        elif _on_cpu(send):
            handle = hvd.allreduce_async_(send, name=name, op=self.op)  # in place; the slice taken after
        else:
            handle = hvd.reducescatter_async(send, name=name, op=self.op)
        c.pending.append((handle, send))
        if self.stage == 2:
            for p in c.params:
                p.grad = None

    def _reduced_gradients(self) -> None:
        """Launch what backward did not (unused parameters, fewer passes than expected), wait, and set each
        slice's gradient: the average (or sum) over ranks of this step's gradients."""
        if self._overrun:
            self._overrun = False
            raise RuntimeError("backward ran more times than backward_passes_per_step before the optimizer "
                               "step: call step() after every backward_passes_per_step passes")
        for c in self.chunks:
            while c.launched < self._launches_per_step:
                self._launch(c)
        began = time.perf_counter()
        wait_asleep(h for c in self.chunks for h, _ in c.pending)
        for c in self.chunks:
            total = None
            for handle, send in c.pending:
                out = send if handle is None else hvd.synchronize(handle)
                if handle is not None and _on_cpu(send):  # this rank's slice, copied: the chunk is freed
                    out = out[self.rank * c.slice_len:(self.rank + 1) * c.slice_len].to(c.flat.dtype, copy=True)
                else:
                    out = out.to(c.flat.dtype)
                total = out if total is None else total.add_(out)
            c.shard.grad = total
            c.new_step()
        _metrics.current().allreduce_wait(time.perf_counter() - began)

    # --- the step --------------------------------------------------------------------------------

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("a sharded optimizer takes no closure (its step is collective)")
        self.step_with()

    def step_with(self, scaler: Optional[torch.amp.GradScaler] = None,
                  clip_grad_norm: Optional[float] = None) -> bool:
        """Reduce, unscale, clip, update the slices, allgather; True if the parameters were updated.
        With a scaler, a step whose gradients hold inf/nan on any rank is skipped on every rank."""
        self._reduced_gradients()
        self._loaded = None
        grads = [c.shard.grad for c in self.chunks]
        if scaler is not None or clip_grad_norm is not None:
            # One allreduce of the shards' squared norms: the global norm, and (inf/nan spreading
            # through the sum) an overflow every rank sees.
            local = sum((torch.linalg.vector_norm(g).double() ** 2 for g in grads),
                        torch.zeros((), dtype=torch.float64, device=grads[0].device if grads else "cpu"))
            total = local if self.size == 1 else hvd.allreduce(local, op=hvd.Sum, name="hvdk8s.zero.norm")
            squared = float(total)
            if scaler is not None:
                if not math.isfinite(squared) and grads:  # so the scaler finds it here too, whatever this shard holds
                    grads[0].view(-1)[0] = math.inf
                scaler.unscale_(self.inner)
                squared /= float(scaler.get_scale()) ** 2
            if clip_grad_norm is not None:
                coef = clip_grad_norm / (math.sqrt(squared) + 1e-6)  # as torch.nn.utils.clip_grad_norm_
                if not coef >= 1.0:  # (nan too, as torch's: such a step is skipped with a scaler)
                    for g in grads:
                        g.mul_(coef)
        for inner, outer in zip(self.inner.param_groups, self.param_groups):
            inner.update(_hyperparameters(outer))
        applied = True
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.step(self.inner)  # skips the inner step on inf/nan, on every rank alike
            scaler.update()
            applied = scaler.get_scale() >= scale
        else:
            self.inner.step()
        for c in self.chunks:  # the reduced shard was for this update only
            c.shard.grad = None
        if applied:
            self._gather_parameters()
        return applied

    def _gather_parameters(self) -> None:
        """Every chunk's updated slices back into the parameters of every rank: on CPU each slice broadcast
        in place from its owner; elsewhere allgathered, a window of chunks at a time, and copied in."""
        if self.size == 1:
            return  # the slice is the whole chunk, updated in place
        broadcasts: list[int] = []
        in_flight: list[tuple[_Chunk, int]] = []
        window = 0
        for c in self.chunks:
            if _on_cpu(c.flat):
                n = c.slice_len
                broadcasts += [hvd.broadcast_async_(c.flat[r * n:(r + 1) * n], root_rank=r, name=f"{c.name}.gather.{r}")
                               for r in range(self.size)]
                continue
            in_flight.append((c, hvd.allgather_async(c.shard, name=f"{c.name}.gather")))
            window += c.flat.numel() * c.flat.element_size()
            while window > GATHER_WINDOW_BYTES:
                window -= self._copy_gathered(*in_flight.pop(0))
        while in_flight:
            self._copy_gathered(*in_flight.pop(0))
        wait_asleep(broadcasts)
        for handle in broadcasts:
            hvd.synchronize(handle)

    def _copy_gathered(self, c: _Chunk, handle: int) -> int:
        """Wait for a chunk's allgather and copy the other ranks' slices in; the chunk's bytes."""
        wait_asleep([handle])
        gathered, n = hvd.synchronize(handle), c.slice_len
        for r in range(self.size):  # this rank's own slice is already in place
            if r != self.rank:
                c.flat[r * n:(r + 1) * n].copy_(gathered[r * n:(r + 1) * n])
        return c.flat.numel() * c.flat.element_size()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for c in self.chunks:
            for p in c.params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
            c.shard.grad = None

    # --- state: the unsharded format -------------------------------------------------------------

    def _indices(self) -> dict[torch.nn.Parameter, int]:
        """Each parameter's index in the unsharded state dict (torch's numbering across groups)."""
        params = [p for group in self.param_groups for p in group["params"]]
        return {p: i for i, p in enumerate(params)}

    @staticmethod
    def _per_element(key: str, value: Any, like: torch.Tensor) -> bool:
        """A state entry with one value per parameter element (momentum, moments), not a scalar (step)."""
        return torch.is_tensor(value) and key != "step" and value.shape == like.shape

    def state_dict(self) -> dict:
        """The full state, as the unsharded optimizer's state_dict() gives it. Collective: every rank calls it."""
        index = self._indices()
        state: dict[int, dict] = {}
        gathers = []
        for c in self.chunks:
            shard_state = self.inner.state.get(c.shard, {})
            for key, value in shard_state.items():
                if self._per_element(key, value, c.shard):
                    handle = None if self.size == 1 else hvd.allgather_async(value, name=f"{c.name}.state.{key}")
                    gathers.append((c, key, value, handle))
                else:
                    for p in c.params:
                        state.setdefault(index[p], {})[key] = value.clone() if torch.is_tensor(value) else value
        wait_asleep(h for *_, h in gathers)
        for c, key, value, handle in gathers:
            full = value.clone() if handle is None else hvd.synchronize(handle)
            for p, part in zip(c.params, c.split(full)):
                state.setdefault(index[p], {})[key] = part
        # Keys in the order the optimizer made them (step, exp_avg, exp_avg_sq), as torch's own state_dict.
        for c in self.chunks:
            order = list(self.inner.state.get(c.shard, {}))
            for p in c.params:
                if index[p] in state:
                    state[index[p]] = {k: state[index[p]][k] for k in order}
        groups, start = [], 0
        for group in self.param_groups:
            groups.append({**_hyperparameters(group), "params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take a full (unsharded) state and keep this rank's part. Raises ValueError, changing nothing,
        for a state of another optimizer layout."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        saved_state = state_dict.get("state") if isinstance(state_dict, dict) else None
        if not isinstance(groups, list) or not isinstance(saved_state, dict):
            raise ValueError("not an optimizer state dict")
        if [len(g.get("params", ())) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the state's parameter groups do not match this optimizer's")
        index = self._indices()
        saved_ids = [i for g in groups for i in g["params"]]
        by_param = {p: saved_state.get(saved_ids[i], {}) for p, i in index.items()}
        for c in self.chunks:  # checked before anything changes
            for p in c.params:
                for key, value in by_param[p].items():
                    if torch.is_tensor(value) and key != "step" and value.dim() and value.shape != p.shape:
                        raise ValueError(f"state {key!r} has shape {tuple(value.shape)}, its parameter "
                                         f"{tuple(p.shape)}")
        new_inner = defaultdict(dict)
        for c in self.chunks:
            keys = list(dict.fromkeys(k for p in c.params for k in by_param[p]))
            shard_state = {}
            for key in keys:
                values = [by_param[p].get(key) for p in c.params]
                at, sample = next((i, v) for i, v in enumerate(values) if v is not None)
                if self._per_element(key, sample, c.params[at]):
                    flat = torch.zeros(c.flat.numel(), dtype=sample.dtype, device=c.flat.device)
                    for o, p, v in zip(c.offsets, c.params, values):
                        if v is not None:
                            flat[o:o + p.numel()].copy_(v.reshape(-1))
                    shard_state[key] = flat[self.rank * c.slice_len:(self.rank + 1) * c.slice_len].clone()
                else:
                    shard_state[key] = sample.clone() if torch.is_tensor(sample) else copy.deepcopy(sample)
            if shard_state:
                new_inner[c.shard] = shard_state
        for group, saved in zip(self.param_groups, groups):
            group.update(_hyperparameters(saved))
        self.inner.state = new_inner
        for inner, outer in zip(self.inner.param_groups, self.param_groups):
            inner.update(_hyperparameters(outer))
        self._loaded = state_dict

    def loaded_state(self) -> Optional[dict]:
        """The full state last loaded on this rank and not yet synced to the others (a checkpoint rank 0 read)."""
        return self._loaded

    def drop_step(self) -> None:
        """Forget the step in progress (launched collectives, counted passes, gradients): after a failure."""
        for c in self.chunks:
            c.new_step()
        self._overrun = False
        self.zero_grad()

    def sync(self, root_rank: int = 0) -> None:
        """Every rank takes root_rank's last loaded full state (after a checkpoint was read there alone)."""
        has = hvd.broadcast_object(self._loaded is not None, root_rank, name="hvdk8s.zero.has_state")
        if has:
            full = hvd.broadcast_object(self._loaded if self.rank == root_rank else None, root_rank,
                                        name="hvdk8s.zero.state")
            if self.rank != root_rank:
                self.load_state_dict(full)
        self._loaded = None

    # --- what it holds ---------------------------------------------------------------------------

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds, measured off the tensors' storages: optimizer state, gradients (the
        parameters' .grad and the slices'), parameters."""
        return {"optimizer_state": storage_bytes(v for s in self.inner.state.values() for v in s.values()),
                "gradients": storage_bytes([p.grad for c in self.chunks for p in c.params]
                                           + [c.shard.grad for c in self.chunks]),
                "parameters": storage_bytes(c.flat for c in self.chunks)}

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield  # nothing to skip: `step` is the synchronization (for code written for Horovod's optimizer)


def storage_bytes(tensors) -> int:
    """The bytes of the distinct storages behind `tensors` (non-tensors and None skipped): what they hold
    in memory, a storage shared by views counted once."""
    seen, total = set(), 0
    for t in tensors:
        if torch.is_tensor(t):
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
    return total
