"""PowerSGD gradient compression with error feedback (Vogels, Karimireddy and Jaggi, NeurIPS 2019) over
Horovod, for hvdk8s.torch.

`ht.distribute(model, optimizer, compression="powersgd", powersgd_rank=4)` returns a `PowerSGDOptimizer`.

A step. Each gradient of a weight with two or more dimensions, seen as a matrix (its first dimension by
the rest), is compressed when its rank-r factors are `min_compression_rate` times smaller than it; the
others (biases, norms, small matrices) are averaged whole. With M = the gradient plus this rank's error
(what compression left out of its earlier gradients): P = M Q, with Q the last step's (the warm start),
averaged over the ranks together with the whole gradients (one allreduce); P's columns orthonormalized;
Q = Mᵀ P, averaged (the second allreduce); the gradient becomes P Qᵀ and the error keeps M - P Qᵀ. The
bytes sent per matrix are (rows + columns) x r instead of rows x columns.

P and Q are linear in M, so a step's result depends only on the ranks' mean M: at full rank it is plain
averaging (to float rounding), and N ranks on shares of a batch equal one process on the whole batch at
any rank. That also makes the state portable: a checkpoint holds the Q matrices and the ranks' mean
error (one allreduce when saving), every rank resumes with that mean, at any rank count, and the training
continues as if uninterrupted. The first `start_step` steps average whole gradients (the paper's and
torch DDP's warm-up: compression from the first step slows early training).

A step whose averaged gradients are not finite (an fp16 overflow on any rank: it reaches every rank
through the sums) leaves the errors and Q matrices as they were, so a skipped step does not poison them.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any

import horovod.torch as hvd
import torch

from hvdk8s import metrics as _metrics
from hvdk8s._torch_wait import wait_asleep
from hvdk8s.compression import (POWERSGD_MIN_COMPRESSION_RATE, POWERSGD_RANK, POWERSGD_START_STEP,
                                should_compress)

_names = itertools.count()


def _column_major(q: torch.Tensor) -> torch.Tensor:
    """A copy of the (cols, rank) matrix `q` laid out as the transpose of a contiguous (rank, cols) one: M Q
    then reads M in the order MKL's skinny products are fast in (4096 x 4096 at rank 4, one thread: 5.7 ms
    against 22 for a row-major Q), and Mᵀ P̂ comes out in that layout without a copy."""
    return q.t().clone(memory_format=torch.contiguous_format).t()


class _Matrix:
    """One compressed gradient: its shape as a matrix, its warm-start Q and this rank's error."""

    def __init__(self, param: torch.nn.Parameter, rank: int, seed: int):
        self.param = param
        self.rows = param.shape[0]
        self.cols = param.numel() // self.rows
        self.rank = min(rank, self.rows, self.cols)
        self.seed = seed
        self.q = self._fresh_q()
        self.error = torch.zeros(self.rows, self.cols, dtype=torch.float32, device=param.device)
        # M = gradient + error, kept from step to step: a matrix of a wide layer is tens of MB, and a new
        # one each step (glibc maps blocks that large afresh) cost its page faults every time
        self.m = torch.empty_like(self.error)

    def _fresh_q(self) -> torch.Tensor:
        """The same random start on every rank (seeded by the matrix's index)."""
        gen = torch.Generator().manual_seed(self.seed)
        return _column_major(torch.randn(self.cols, self.rank, generator=gen).to(self.param.device))

    def restart_q_if_degenerate(self) -> None:
        """A Q of zeros (a gradient that was all zeros, e.g. a frozen step) would keep P = M Q at zero forever."""
        if not torch.isfinite(self.q).all() or not self.q.abs().sum():
            self.q = self._fresh_q()


class PowerSGDOptimizer(torch.optim.Optimizer):
    """A data-parallel optimizer whose gradients are averaged through PowerSGD.

    `param_groups` and `state` are the wrapped optimizer's; `state_dict()` is its format plus a "powersgd"
    entry (collective: every rank calls it, for the ranks' mean error); `load_state_dict()` takes either.
    `synchronize()` averages the gradients (ht.step calls it before unscaling and clipping), `step()`
    synchronizes unless inside `skip_synchronize()`, as Horovod's DistributedOptimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, rank: int = POWERSGD_RANK,
                 start_step: int = POWERSGD_START_STEP, min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE,
                 op=None):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"powersgd rank must be a whole number >= 1, got {rank!r}")
        if op not in (None, hvd.Average, hvd.Sum):
            raise ValueError("PowerSGD averages or sums gradients (op=ht.Average or ht.Sum), not Adasum")
        self.inner, self.rank, self.start_step = optimizer, rank, start_step
        self.min_compression_rate = min_compression_rate
        self.op = hvd.Average if op is None else op
        self._prefix = f"hvdk8s.powersgd{next(_names)}"
        self.steps = 0  # optimizer steps taken (compression starts at start_step)
        self._skip = False
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self._share_inner()
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self.matrices: dict[torch.nn.Parameter, _Matrix] = {}
        for i, p in enumerate(params):
            if p.dim() >= 2 and should_compress(p.shape[0], p.numel() // p.shape[0], rank, min_compression_rate):
                self.matrices[p] = _Matrix(p, rank, seed=i)
        self.whole = [p for p in params if p not in self.matrices]

    def _share_inner(self) -> None:
        """The wrapped optimizer's own group list and state: one learning rate to set, one state. Again after
        each load, as torch's load_state_dict replaces both (the learning rates the trainer sets would
        otherwise stop reaching the step: a resumed run kept the checkpoint's)."""
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    # --- the gradients --------------------------------------------------------------------------

    def _allreduce(self, flat: torch.Tensor, what: str) -> torch.Tensor:
        """The ranks' average of `flat`; its wait counted as the step's allreduce wait (metrics)."""
        if hvd.size() == 1:
            return flat
        began = time.perf_counter()
        handle = hvd.allreduce_async(flat, op=hvd.Average, name=f"{self._prefix}.{what}")
        wait_asleep([handle])  # not Horovod's wait, which keeps a core busy (hvdk8s._torch_wait)
        out = hvd.synchronize(handle)
        _metrics.current().allreduce_wait(time.perf_counter() - began)
        return out

    def synchronize(self) -> None:
        """Replace every gradient by its average over the ranks (compressed from start_step on)."""
        if self._skip:
            return
        compress = self.steps >= self.start_step and self.matrices
        matrices = list(self.matrices.values()) if compress else []
        whole = self.whole if compress else self.whole + list(self.matrices)
        grads = {p: (p.grad.detach().float() if p.grad is not None else torch.zeros(p.shape, device=p.device))
                 for p in [*whole, *(m.param for m in matrices)]}
        ms = [torch.add(m.error, grads[m.param].reshape(m.rows, m.cols), out=m.m) for m in matrices]
        for m in matrices:
            m.restart_q_if_degenerate()
        # First collective: P = M Q of every matrix and the gradients sent whole.
        ps = [mi @ m.q for mi, m in zip(ms, matrices)]
        flat = self._allreduce(torch.cat([t.reshape(-1) for t in [*ps, *(grads[p] for p in whole)]]
                                         or [torch.zeros(0)]), "p")
        offset = 0
        for i, m in enumerate(matrices):
            ps[i] = flat[offset:offset + m.rows * m.rank].view(m.rows, m.rank)
            offset += m.rows * m.rank
        for p in whole:
            self._set_grad(p, flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        if not matrices:
            return
        finite = bool(torch.isfinite(flat).all())
        if not finite:  # an overflow on some rank: the step will be skipped; keep errors and Q untouched
            for m in matrices:
                self._set_grad(m.param, torch.full(m.param.shape, float("nan"), device=m.param.device))
            return
        # Second collective: Q = Mᵀ P̂ with P̂ orthonormal.
        ps = [torch.linalg.qr(p, mode="reduced").Q for p in ps]
        # (Mᵀ P̂)ᵀ = P̂ᵀ M, reading M along its rows (3x faster here), in Q's column-major layout
        qts = [p.t() @ mi for mi, p in zip(ms, ps)]
        flat_q = self._allreduce(torch.cat([qt.reshape(-1) for qt in qts]), "q")
        offset = 0
        for mi, p, m in zip(ms, ps, matrices):
            m.q = _column_major(flat_q[offset:offset + m.cols * m.rank].view(m.rank, m.cols).t())
            offset += m.cols * m.rank
            approx = self._approximation(m, p)  # P Qᵀ, written where the gradient goes
            torch.sub(mi, approx, out=m.error)  # what this rank's gradient lost, added to its next one

    def _approximation(self, m: _Matrix, p: torch.Tensor) -> torch.Tensor:
        """P Qᵀ as m.param's gradient, computed into its .grad where that is a float32 tensor of this
        process's own (no copy of a matrix of tens of MB), else set as _set_grad does. Returns it as a matrix."""
        grad = m.param.grad
        if grad is not None and grad.dtype == torch.float32 and grad.is_contiguous() and not (
                self.op is hvd.Sum and hvd.size() > 1):
            out = grad.view(m.rows, m.cols)
            return torch.mm(p, m.q.t(), out=out)
        approx = p @ m.q.t()
        self._set_grad(m.param, approx.view(m.param.shape))
        return approx

    def _set_grad(self, p: torch.nn.Parameter, value: torch.Tensor) -> None:
        if self.op is hvd.Sum and hvd.size() > 1:
            value = value * hvd.size()
        if p.grad is None:
            p.grad = value.to(p.dtype).clone()
        else:
            p.grad.copy_(value)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() without averaging again (after synchronize(), unscaling and clipping)."""
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("a PowerSGD optimizer takes no closure (its step is collective)")
        self.synchronize()
        self.inner.step()
        self.steps += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    # --- state -----------------------------------------------------------------------------------

    def _index(self) -> dict[torch.nn.Parameter, int]:
        return {p: i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}

    def compression_state(self, local: bool = False) -> dict[str, Any]:
        """{"steps", "rank", "q": {index: Q}, "error": {index: the ranks' mean error}}. Collective (one
        allreduce of the errors) unless `local`, which takes this rank's own errors (equal on every rank
        right after a load or a sync)."""
        index = self._index()
        matrices = list(self.matrices.values())
        errors = [m.error for m in matrices]
        if not local and hvd.size() > 1 and errors:
            flat = hvd.allreduce(torch.cat([e.reshape(-1) for e in errors]), op=hvd.Average,
                                 name=f"{self._prefix}.error")
            errors, offset = [], 0
            for m in matrices:
                errors.append(flat[offset:offset + m.rows * m.cols].view(m.rows, m.cols))
                offset += m.rows * m.cols
        return {"steps": self.steps, "rank": self.rank,
                "q": {index[m.param]: m.q.clone() for m in matrices},
                "error": {index[m.param]: e.clone() for m, e in zip(matrices, errors)}}

    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict plus "powersgd" (compression_state). Collective."""
        return {**self.inner.state_dict(), "powersgd": self.compression_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Either format: a plain optimizer's state (compression starts afresh) or this one's. A
        "powersgd" entry of another rank or other shapes is refused (ValueError) before anything changes."""
        saved = state_dict.get("powersgd") if isinstance(state_dict, dict) else None
        if saved is not None:
            self._check(saved)
        self.inner.load_state_dict({k: v for k, v in state_dict.items() if k != "powersgd"})
        self._share_inner()
        if saved is not None:
            self._load_compression(saved)

    def _check(self, saved: Any) -> None:
        if not (isinstance(saved, dict) and {"steps", "rank", "q", "error"} <= saved.keys()):
            raise ValueError("not a PowerSGD state")
        if saved["rank"] != self.rank:
            raise ValueError(f"the checkpoint's PowerSGD rank is {saved['rank']}, this optimizer's {self.rank}")
        index = self._index()
        for m in self.matrices.values():
            q, e = saved["q"].get(index[m.param]), saved["error"].get(index[m.param])
            if q is not None and tuple(q.shape) != (m.cols, m.rank) or e is not None and tuple(e.shape) != (m.rows, m.cols):
                raise ValueError("the checkpoint's PowerSGD matrices do not fit this model")

    def _load_compression(self, saved: dict) -> None:
        index = self._index()
        self.steps = int(saved["steps"])
        for m in self.matrices.values():
            i = index[m.param]
            if i in saved["q"]:
                m.q = _column_major(saved["q"][i].to(device=m.param.device, dtype=torch.float32))
            m.error = (saved["error"][i].to(device=m.param.device, dtype=torch.float32).clone()
                       if i in saved["error"] else torch.zeros_like(m.error))

    def sync(self, root_rank: int = 0) -> None:
        """Every rank takes root_rank's state: the wrapped optimizer's (as Horovod broadcasts it) and the
        compression's (root_rank's errors: the mean after a load)."""
        if hvd.size() == 1:
            return
        has_state = hvd.broadcast_object(bool(self.inner.state_dict()["state"]), root_rank,
                                         name=f"{self._prefix}.has_state")
        if has_state:
            hvd.broadcast_optimizer_state(self.inner, root_rank)
            self.inner.zero_grad()
        saved = hvd.broadcast_object(self.compression_state(local=True) if hvd.rank() == root_rank else None,
                                     root_rank, name=f"{self._prefix}.state")
        self._load_compression(saved)

    def reset_compression(self) -> None:
        """Zero errors, fresh Q matrices (the same on every rank): after an elastic change of workers, whose
        lost ranks took their errors with them."""
        for m in self.matrices.values():
            m.q = m._fresh_q()
            m.error = torch.zeros_like(m.error)
