"""PowerSGD gradient compression with error feedback over Horovod, for hvdk8s.tensorflow (Keras 3).

The algorithm of hvdk8s/_torch_powersgd.py, as a mixin of the distributed Keras optimizer: each weight
gradient seen as a matrix (its first dimension by the rest) whose rank-r factors are
`min_compression_rate` times smaller (hvdk8s.compression.should_compress) is sent as P = M Q and Q = Mᵀ P̂
(M = the gradient plus this rank's error, Q the last step's, P̂ P with orthonormal columns); the others
are averaged whole in the first of the two allreduces. The error keeps M - P̂ Qᵀ. The first `start_step`
updates average whole gradients. Everything runs inside the traced step (model.fit's tf.function): the
start and the overflow check are `tf.cond`s on values every rank shares, so every rank takes the same
branch and the same collectives.

The state is optimizer variables (so broadcasts, Keras's own saving and hvdk8s's checkpoints carry it):
per matrix its Q and this rank's error, and a step counter. A step's result depends only on the ranks'
mean M (P and Q are linear in M), so replacing every rank's error by the ranks' mean changes nothing:
`average_errors()` does that before a checkpoint is written (rank 0's copy is then the mean), and a run
resumed from it, at any rank count, continues as if uninterrupted. `reset_compression()` zeroes the errors
and restarts Q (an elastic change of workers). A step whose averaged P is not finite (an fp16 overflow
on some rank: the loss-scale optimizer then skips it) leaves the state as it was.
"""
from __future__ import annotations

from typing import Optional, Sequence

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdk8s import _adapter
from hvdk8s.compression import (POWERSGD_MIN_COMPRESSION_RATE, POWERSGD_RANK, POWERSGD_START_STEP,
                                should_compress)


def settings(given: Optional[dict]) -> dict:
    """distribute()'s `powersgd` dict completed with the defaults, or ValueError naming the bad key."""
    out = {"rank": POWERSGD_RANK, "start_step": POWERSGD_START_STEP,
           "min_compression_rate": POWERSGD_MIN_COMPRESSION_RATE}
    unknown = set(given or {}) - set(out)
    if unknown:
        raise ValueError(f"powersgd: unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(out)}")
    out.update(given or {})
    if isinstance(out["rank"], bool) or not isinstance(out["rank"], int) or out["rank"] < 1:
        raise ValueError(f"powersgd rank must be a whole number >= 1, got {out['rank']!r}")
    if isinstance(out["start_step"], bool) or not isinstance(out["start_step"], int) or out["start_step"] < 0:
        raise ValueError(f"powersgd start_step must be a whole number >= 0, got {out['start_step']!r}")
    if not isinstance(out["min_compression_rate"], (int, float)) or out["min_compression_rate"] < 0:
        raise ValueError(f"powersgd min_compression_rate must be >= 0, got {out['min_compression_rate']!r}")
    return out


class _Matrix:
    """One compressed variable's gradient: its shape as a matrix, its Q and error (optimizer variables)
    and q0, the Q every rank starts from."""

    def __init__(self, rows: int, cols: int, rank: int, q0: np.ndarray, q, error):
        self.rows, self.cols, self.rank, self.q0, self.q, self.error = rows, cols, rank, q0, q, error


class PowerSGD:
    """Mixed in before hvdk8s.tensorflow's reducing mixins: `_hvdk8s_powersgd` holds the settings."""

    _hvdk8s_powersgd: dict = {}
    _hvdk8s_matrices: dict = {}  # id(model variable) -> _Matrix, set by build
    _hvdk8s_powersgd_variables: frozenset = frozenset()  # ids of the state's variables

    def build(self, variables):
        super().build(variables)
        if self._hvdk8s_matrices:
            return
        s = self._hvdk8s_powersgd
        matrices = {}
        steps = self.add_variable((), initializer="zeros", dtype="int64", name="powersgd_steps")
        state = [steps]
        for i, v in enumerate(variables):
            shape = tuple(int(d) for d in v.shape)
            if len(shape) < 2:
                continue
            rows, cols = shape[0], int(np.prod(shape[1:]))
            if not should_compress(rows, cols, s["rank"], s["min_compression_rate"]):
                continue
            rank = min(s["rank"], rows, cols)
            q0 = np.random.default_rng(i).standard_normal((cols, rank)).astype(np.float32)  # seeded alike
            q = self.add_variable((cols, rank), initializer=lambda shape, dtype=None, q0=q0: tf.constant(q0),
                                  dtype="float32", name=f"powersgd_q_{i}")
            error = self.add_variable((rows, cols), initializer="zeros", dtype="float32", name=f"powersgd_error_{i}")
            matrices[id(v)] = _Matrix(rows, cols, rank, q0, q, error)
            state += [q, error]
        # object.__setattr__: Keras's own would track the dict's variables a second time
        object.__setattr__(self, "_hvdk8s_steps", steps)
        object.__setattr__(self, "_hvdk8s_matrices", matrices)
        object.__setattr__(self, "_hvdk8s_powersgd_variables", frozenset(id(v) for v in state))

    # --- the gradients ------------------------------------------------------------------------------

    def _hvdk8s_powersgd_reduce(self, grads: list, variables: Sequence) -> list:
        """`grads` (of `variables`, none of them None) averaged over the ranks through PowerSGD."""
        if len(grads) != len(variables):
            raise ValueError("PowerSGD: Keras applied other gradients than it was given variables for")
        compressed = [(i, self._hvdk8s_matrices[id(v)]) for i, v in enumerate(variables)
                      if id(v) in self._hvdk8s_matrices]
        started = self._hvdk8s_steps >= self._hvdk8s_powersgd["start_step"]
        if not compressed:
            out = self._whole(grads)
        else:
            out = tf.cond(started, lambda: self._compressed(grads, compressed), lambda: self._whole(grads))
        self._hvdk8s_steps.assign_add(1)
        return list(out)

    @staticmethod
    def _average(flat: tf.Tensor) -> tf.Tensor:
        if _adapter.alone(hvd.size()):
            return flat  # (not elastic) the mean of one rank's; the compression still runs, as at N ranks
        return hvd.allreduce(flat, op=hvd.Average)

    def _whole(self, grads: list) -> list:
        """Every gradient averaged whole, in one allreduce."""
        flat = self._average(tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in grads], 0))
        parts = tf.split(flat, [int(np.prod(g.shape)) for g in grads])
        return [tf.cast(tf.reshape(p, g.shape), g.dtype) for p, g in zip(parts, grads)]

    def _compressed(self, grads: list, compressed: list) -> list:
        mats = dict(compressed)
        whole = [i for i in range(len(grads)) if i not in mats]
        ms, ps = {}, {}
        for i, m in compressed:
            ms[i] = tf.reshape(tf.cast(grads[i], tf.float32), [m.rows, m.cols]) + m.error
            q = tf.convert_to_tensor(m.q)
            usable = tf.logical_and(tf.reduce_all(tf.math.is_finite(q)), tf.reduce_any(tf.not_equal(q, 0.0)))
            q = tf.where(usable, q, tf.constant(m.q0))  # a Q of zeros would keep P = M Q at zero for good
            ps[i] = tf.matmul(ms[i], q)
        # First collective: every P and the gradients sent whole.
        sizes = [m.rows * m.rank for _, m in compressed] + [int(np.prod(grads[i].shape)) for i in whole]
        flat = self._average(tf.concat([tf.reshape(ps[i], [-1]) for i, _ in compressed]
                                       + [tf.reshape(tf.cast(grads[i], tf.float32), [-1]) for i in whole], 0))
        parts = tf.split(flat, sizes)
        out = list(grads)
        for (i, m), part in zip(compressed, parts):
            ps[i] = tf.reshape(part, [m.rows, m.rank])
        for i, part in zip(whole, parts[len(compressed):]):
            out[i] = tf.cast(tf.reshape(part, grads[i].shape), grads[i].dtype)

        def second() -> list:
            """Q = Mᵀ P̂ averaged (the second collective); the gradient P̂ Qᵀ; the error what it left out."""
            hats = {i: tf.linalg.qr(ps[i], full_matrices=False)[0] for i, _ in compressed}
            # (Mᵀ P̂)ᵀ = P̂ᵀ M, reading M along its rows: 14 ms against 127 for Mᵀ P̂
            # (4096 x 4096 at rank 4, one thread)
            qts = self._average(tf.concat([tf.reshape(tf.matmul(hats[i], ms[i], transpose_a=True), [-1])
                                           for i, _ in compressed], 0))
            new = list(out)
            for (i, m), qt in zip(compressed, tf.split(qts, [m.cols * m.rank for _, m in compressed])):
                q = tf.transpose(tf.reshape(qt, [m.rank, m.cols]))
                approx = tf.matmul(hats[i], q, transpose_b=True)
                m.q.assign(q)
                m.error.assign(ms[i] - approx)
                new[i] = tf.cast(tf.reshape(approx, grads[i].shape), grads[i].dtype)
            return new

        def overflowed() -> list:
            """An overflow on some rank (its sums reach every rank): the step is skipped; the state stays."""
            new = list(out)
            for i, _ in compressed:
                new[i] = tf.fill(tf.shape(grads[i]), tf.constant(float("nan"), grads[i].dtype))
            return new

        finite = tf.reduce_all(tf.math.is_finite(flat))
        return tf.cond(finite, second, overflowed)

    # --- state -------------------------------------------------------------------------------------

    def reset_compression(self) -> None:
        """Zero errors and every rank's starting Q (after an elastic change of workers, whose lost ranks
        took their errors with them)."""
        for m in self._hvdk8s_matrices.values():
            m.q.assign(m.q0)
            m.error.assign(tf.zeros_like(m.error))

    def average_errors(self) -> None:
        """Every rank's error replaced by the ranks' mean (collective; the training continues the same:
        a step depends only on the mean). Before a checkpoint, so that rank 0's copy is the whole state."""
        matrices = list(self._hvdk8s_matrices.values())
        if not matrices or _adapter.alone(hvd.size()):
            return
        flat = hvd.allreduce(tf.concat([tf.reshape(m.error, [-1]) for m in matrices], 0), op=hvd.Average,
                             name="hvdk8s.powersgd.errors")
        for m, part in zip(matrices, tf.split(flat, [m.rows * m.cols for m in matrices])):
            m.error.assign(tf.reshape(part, [m.rows, m.cols]))
