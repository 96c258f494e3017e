"""Sharded optimizer state (ZeRO stages 1 and 2) for Keras 3 optimizers over Horovod:
`htf.distribute(model, optimizer, shard_optimizer_state=1 or 2)` returns the user's optimizer class
with `Sharded` mixed in (docs/sharded-optimizer.md; hvdk8s/_torch_sharded.py is PyTorch's).

- Layout: the model's trainable variables, in order, packed into flat chunks of about 4 MiB (one dtype
  and one weight-decay choice each), each padded to a multiple of the ranks' number; rank r owns slice r
  of every chunk, a `keras.Variable` of its own (a "shard"). Equal shards to the element, whatever the
  variables' sizes.
- A working copy of the user's optimizer (same class and settings, from `get_config`) is built on this
  rank's shards: its moments are 1/N of the unsharded ones. The optimizer the user holds keeps the
  settings, `learning_rate` and `iterations` (what schedules, callbacks and the trainer read and set);
  each step hands them to the copy and takes its `iterations` back.
- A step (`apply`): each chunk's gradients are reduce-scattered (averaged), so a rank holds only its
  shard of them; a LossScaleOptimizer's finiteness check and a `global_clipnorm` clip are taken over all
  shards (one allreduce each), so every rank takes the same branch; the copy updates the shards (with
  backward_passes_per_step, Keras's accumulation on the shards: each micro-batch is reduce-scattered);
  then every chunk is allgathered back into the model's variables. Keras keeps no gradients between
  steps, so stages 1 and 2 do the same here.
- State: `gathered_state()` (collective) is the unsharded optimizer's `variables`, in its order, so a
  checkpoint resumes at any rank count, sharded or not; `load_state()` takes that format back.
  `reshard()` lays the shards out again for a new number of ranks (elastic training).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from keras import ops

CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class Chunk:
    """Model variables `members` (indices) packed flat in that order: `length` elements with the padding
    to a multiple of `ranks`, of which each rank owns `shard`."""
    dtype: str
    decay: bool
    members: tuple[int, ...]
    sizes: tuple[int, ...]
    length: int
    ranks: int

    @property
    def shard(self) -> int:
        return self.length // self.ranks


def plan_chunks(variables: Sequence, decays: Sequence[bool], ranks: int,
                chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """The chunks of `variables` for `ranks` ranks: consecutive variables of one dtype and weight-decay
    choice, about chunk_bytes each (a larger variable is a chunk alone), padded to a multiple of ranks."""
    open_: dict[tuple[str, bool], list[int]] = {}
    chunks: list[Chunk] = []
    size = [int(np.prod(v.shape)) for v in variables]

    def close(key):
        members = open_.pop(key)
        total = sum(size[i] for i in members)
        chunks.append(Chunk(key[0], key[1], tuple(members), tuple(size[i] for i in members),
                            max(1, -(-total // ranks)) * ranks, ranks))

    for i, (v, decay) in enumerate(zip(variables, decays)):
        dtype = tf.as_dtype(v.dtype)
        key = (dtype.name, bool(decay))
        if key in open_ and (sum(size[j] for j in open_[key]) + size[i]) * dtype.size > chunk_bytes:
            close(key)
        open_.setdefault(key, []).append(i)
    for key in list(open_):
        close(key)
    return chunks


class _Work:
    """Mixed into the working copy's class (the user's plain optimizer class, built on the shards): clip
    by the norm of all ranks' shards, and weight decay by the choice of the chunk's model variables."""

    _hvdk8s_decay: dict = {}  # the shard's key (Keras's _var_key) -> whether weight decay applies
    _hvdk8s_ranks = 1

    def _clip_gradients(self, grads):
        if self.global_clipnorm and self.global_clipnorm > 0:
            squares = ops.sum(ops.stack([ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads if g is not None]))
            if self._hvdk8s_ranks > 1:
                squares = hvd.allreduce(squares, op=hvd.Sum, name=_eager_name("hvdk8s.shard_norm"))
            norm = ops.sqrt(squares)
            scale = self.global_clipnorm * ops.minimum(1.0 / norm, 1.0 / self.global_clipnorm)
            scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras's clip_by_global_norm
            return [g if g is None else g * ops.cast(scale, g.dtype) for g in grads]
        return super()._clip_gradients(grads)

    def _use_weight_decay(self, variable):
        # Keras's key: TensorFlow's backend hands the update the tf.Variable inside a keras.Variable
        return self._hvdk8s_decay.get(self._var_key(variable), True)


def _eager_name(name: str) -> Optional[str]:
    """A collective's name when run eagerly; in a traced step Horovod names it after its tensor (two traced
    steps in one process must not share a name)."""
    return name if tf.executing_eagerly() else None


def _plain(optimizer):
    """The optimizer that updates: a LossScaleOptimizer's inner one, or the optimizer itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def _is_variable(x) -> bool:
    return isinstance(x, (keras.Variable, tf.Variable))


class Sharded:
    """Mixed into (a copy of) the user's optimizer class by `htf.distribute(shard_optimizer_state=)`.
    Class attributes set there: `_hvdk8s_plain_cls` (the user's plain optimizer class: a
    LossScaleOptimizer's inner one's) and `_hvdk8s_compression` (Horovod's compressor)."""

    _hvdk8s_plain_cls: type = keras.optimizers.Optimizer
    _hvdk8s_compression: Any = hvd.Compression.none

    # --- layout -------------------------------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        variables = list(variables)
        if any(getattr(v, "overwrite_with_gradient", False) for v in variables):
            raise ValueError("shard_optimizer_state: a variable Keras overwrites with its gradient (float8 "
                             "scaling) cannot be sharded")
        plain = _plain(self)
        object.__setattr__(self, "_hvdk8s_model", variables)
        object.__setattr__(self, "_hvdk8s_decays", [plain._use_weight_decay(v) for v in variables])
        super().build([])  # the settings' own variables (iterations, learning rate, loss scale): no slots
        self.reshard()

    def reshard(self, state: Optional[Sequence[np.ndarray]] = None) -> None:
        """Lay the shards out for the ranks there are now, from the model's variables, and load `state`
        (the unsharded format, `gathered_state`; None: the state stays as it is where the ranks did not
        change, and starts afresh where they did). Local, no collective: each rank takes its part."""
        if state is None and getattr(self, "_hvdk8s_work", None) is not None and _layout_ranks(self) == hvd.size():
            return
        ranks, rank = hvd.size(), hvd.rank()
        model = self._hvdk8s_model
        chunks = plan_chunks(model, self._hvdk8s_decays, ranks)
        shards = []
        for i, c in enumerate(chunks):
            flat = _flat_values([model[m] for m in c.members], c.length)
            shards.append(keras.Variable(flat[rank * c.shard:(rank + 1) * c.shard], dtype=c.dtype, trainable=False,
                                         name=f"hvdk8s_shard_{i}"))
        plain = _plain(self)
        work_cls = type(self._hvdk8s_plain_cls.__name__, (_Work, self._hvdk8s_plain_cls),
                        {"__module__": self._hvdk8s_plain_cls.__module__})
        work = work_cls.from_config(plain.get_config())
        # object.__setattr__: Keras's own would track what is set as the optimizer's state.
        object.__setattr__(work, "_hvdk8s_decay", {work._var_key(s): c.decay for s, c in zip(shards, chunks)})
        object.__setattr__(work, "_hvdk8s_ranks", ranks)
        slots = _record_slots(work)
        work.build(shards)
        index = {id(s): k for k, s in enumerate(shards)}
        for attr, value in (("_hvdk8s_chunks", chunks), ("_hvdk8s_shards", shards), ("_hvdk8s_work", work),
                            ("_hvdk8s_slots", {k: (index[id(ref)], name) for k, (ref, name) in slots.items()})):
            object.__setattr__(self, attr, value)
        if state is not None:
            self.load_state(state)

    # --- the step -----------------------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert  # as hvdk8s.tensorflow's apply, for the same reason
    def apply(self, grads, trainable_variables=None):
        if not self.built:
            self.build(trainable_variables if trainable_variables is not None else [])
        model = self._hvdk8s_model
        by_id = {id(v): i for i, v in enumerate(model)}
        full: list = [None] * len(model)
        for g, v in zip(grads, model if trainable_variables is None else trainable_variables):
            if id(v) not in by_id:
                raise ValueError(f"shard_optimizer_state: variable {v.name} is not one the optimizer was built for")
            full[by_id[id(v)]] = g
        flats = [tf.concat([tf.reshape(tf.cast(full[m], c.dtype) if full[m] is not None
                                       else tf.zeros([s], c.dtype), [-1]) for m, s in zip(c.members, c.sizes)]
                           + [tf.zeros([c.length - sum(c.sizes)], c.dtype)], 0) for c in self._hvdk8s_chunks]
        ranks = _layout_ranks(self)
        shard_grads = (hvd.grouped_reducescatter(flats, op=hvd.Average, compression=self._hvdk8s_compression)
                       if ranks > 1 else flats)
        if isinstance(self, keras.optimizers.LossScaleOptimizer):
            self._hvdk8s_scaled_step(shard_grads)
        else:
            self._hvdk8s_step(shard_grads)
        k = self._hvdk8s_work.gradient_accumulation_steps
        if k:  # the shards changed only if this micro-batch was the update's last
            ops.cond(ops.equal(_plain(self)._iterations % k, 0), self._hvdk8s_gather_into_model, lambda: None)
        else:
            self._hvdk8s_gather_into_model()

    def _hvdk8s_step(self, shard_grads) -> None:
        plain, work = _plain(self), self._hvdk8s_work
        work._iterations.assign(plain._iterations)
        if _is_variable(plain._learning_rate) and _is_variable(work._learning_rate):
            work._learning_rate.assign(plain._learning_rate)
        work.apply(shard_grads, self._hvdk8s_shards)
        plain._iterations.assign(work._iterations)

    def _hvdk8s_scaled_step(self, shard_grads) -> None:
        """LossScaleOptimizer's step on the shards: the finiteness verdict is all ranks' (a rank whose own
        shard is finite skips with the others), then unscale, step, and grow or shrink the scale as Keras's."""
        bad = ops.sum(ops.stack([ops.sum(ops.cast(ops.logical_not(ops.isfinite(g)), "float32")) for g in shard_grads]))
        if _layout_ranks(self) > 1:
            bad = hvd.allreduce(bad, op=hvd.Sum, name=_eager_name("hvdk8s.shard_finite"))
        scale = self.dynamic_scale

        def finite():
            self._hvdk8s_step([g / ops.cast(scale, g.dtype) for g in shard_grads])
            ops.cond(ops.equal(self.step_counter, self.dynamic_growth_steps - 1),
                     lambda: (self.step_counter.assign(0), self.dynamic_scale.assign(self.dynamic_scale * 2.0))[0],
                     lambda: self.step_counter.assign_add(1))

        def non_finite():
            self.step_counter.assign(0)
            self.dynamic_scale.assign(self.dynamic_scale * 0.5)

        ops.cond(ops.equal(bad, 0.0), finite, non_finite)

    def _hvdk8s_gather_into_model(self) -> None:
        values = [s.value for s in self._hvdk8s_shards]
        full = hvd.grouped_allgather(values) if _layout_ranks(self) > 1 else values
        model = self._hvdk8s_model
        for c, flat in zip(self._hvdk8s_chunks, full):
            parts = tf.split(flat[:sum(c.sizes)], list(c.sizes))
            for m, part in zip(c.members, parts):
                model[m].assign(tf.cast(tf.reshape(part, model[m].shape), model[m].dtype))

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: `optimizer_state` (the working copy's per-variable state, on the shards)
        and `shards` (this rank's slices of the parameters, which the update writes)."""
        work = self._hvdk8s_work
        return {"optimizer_state": sum(np.asarray(v).nbytes for v in work.variables if id(v) in self._hvdk8s_slots),
                "shards": sum(np.asarray(s).nbytes for s in self._hvdk8s_shards)}

    # --- state in the unsharded format ----------------------------------------------------------------
    def gathered_state(self) -> list[np.ndarray]:
        """The optimizer's state as an unsharded optimizer of the same class and settings holds it (its
        `variables`, in order). Collective: every rank calls it; every rank gets it."""
        work, chunks = self._hvdk8s_work, self._hvdk8s_chunks
        slot_vars = [v for v in work.variables if id(v) in self._hvdk8s_slots]
        values = [v.value for v in slot_vars]
        gathered = hvd.grouped_allgather(values) if values and _layout_ranks(self) > 1 else values
        full_slots: dict[tuple[int, str], np.ndarray] = {}  # (model variable, slot name) -> value
        for v, flat in zip(slot_vars, gathered):
            k, name = self._hvdk8s_slots[id(v)]
            flat, c = np.asarray(flat), chunks[k]
            offset = 0
            for m, s in zip(c.members, c.sizes):
                full_slots[(m, name)] = flat[offset:offset + s].reshape(tuple(self._hvdk8s_model[m].shape))
                offset += s
        return [full_slots[e] if isinstance(e, tuple) else np.asarray(e) for e in self._unsharded_entries()]

    def _unsharded_entries(self) -> list:
        """What holds each array of the unsharded format, in its order: a variable of this optimizer's own
        (a LossScaleOptimizer's, or the working copy's iterations and learning rate), or for per-variable
        state its key (model variable, slot name)."""
        own, layout = _reference_layout(self)
        work_plain = iter(v for v in self._hvdk8s_work.variables if id(v) not in self._hvdk8s_slots)
        return [*own, *(next(work_plain) if entry is None else entry for entry in layout)]

    def _state_specs(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        """(shape, dtype) of each array of the unsharded format."""
        chunk_of = {m: k for k, c in enumerate(self._hvdk8s_chunks) for m in c.members}
        slot_dtype = {self._hvdk8s_slots[id(v)]: v.dtype for v in self._hvdk8s_work.variables
                      if id(v) in self._hvdk8s_slots}
        return [(tuple(self._hvdk8s_model[e[0]].shape), _np_dtype(slot_dtype[(chunk_of[e[0]], e[1])]))
                if isinstance(e, tuple) else (tuple(e.shape), _np_dtype(e.dtype)) for e in self._unsharded_entries()]

    def state_templates(self) -> list[np.ndarray]:
        """Zeros shaped and typed as `gathered_state`'s arrays (to receive a broadcast of it)."""
        return [np.zeros(shape, dtype) for shape, dtype in self._state_specs()]

    def state_shapes(self) -> list[tuple[int, ...]]:
        return [shape for shape, _ in self._state_specs()]

    def load_state(self, state: Sequence[np.ndarray]) -> None:
        """Take the unsharded format (`gathered_state`, or an unsharded optimizer's `variables`): keep this
        rank's part. Local: every rank passes the same arrays."""
        entries = self._unsharded_entries()
        if len(state) != len(entries):
            raise ValueError(f"the optimizer state has {len(state)} arrays; this optimizer's has {len(entries)}")
        given: dict[tuple[int, str], np.ndarray] = {}
        for entry, value in zip(entries, state):
            if isinstance(entry, tuple):
                given[entry] = np.asarray(value)
            else:
                entry.assign(value)
        work, chunks, rank = self._hvdk8s_work, self._hvdk8s_chunks, hvd.rank()
        for v in work.variables:
            if id(v) in self._hvdk8s_slots:
                k, name = self._hvdk8s_slots[id(v)]
                c = chunks[k]
                flat = np.zeros(c.length, dtype=tf.as_dtype(v.dtype).as_numpy_dtype)
                offset = 0
                for m, s in zip(c.members, c.sizes):
                    flat[offset:offset + s] = given[(m, name)].reshape(-1)
                    offset += s
                v.assign(flat[rank * c.shard:(rank + 1) * c.shard])
        plain = _plain(self)
        plain._iterations.assign(work._iterations)
        if _is_variable(plain._learning_rate) and _is_variable(work._learning_rate):
            plain._learning_rate.assign(work._learning_rate)


def _layout_ranks(optimizer) -> int:
    chunks = getattr(optimizer, "_hvdk8s_chunks", None)
    return chunks[0].ranks if chunks else hvd.size()


def _np_dtype(dtype) -> np.dtype:
    return tf.as_dtype(dtype).as_numpy_dtype


def _flat_values(variables: Sequence, length: int) -> np.ndarray:
    parts = [np.asarray(v).reshape(-1) for v in variables]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return np.concatenate([flat, np.zeros(length - flat.size, dtype=flat.dtype)])


def _record_slots(optimizer) -> dict[int, tuple[Any, str]]:
    """Record, from now on, each variable `optimizer` creates from a reference variable: id -> (reference,
    name). Every Keras 3 optimizer creates its per-variable state so (add_variable_from_reference)."""
    recorded: dict[int, tuple[Any, str]] = {}
    create = optimizer.add_variable_from_reference

    def add_variable_from_reference(reference_variable, name=None, initializer="zeros"):
        v = create(reference_variable, name=name, initializer=initializer)
        recorded[id(v)] = (reference_variable, name or "var")
        return v

    object.__setattr__(optimizer, "add_variable_from_reference", add_variable_from_reference)
    return recorded


def _reference_layout(sharded) -> tuple[list, list[Optional[tuple[int, str]]]]:
    """What an unsharded optimizer of the same class and settings holds, in its `variables` order: the
    LossScaleOptimizer's own variables (taken from `sharded`, which holds them), then for the plain
    optimizer's each entry None (a variable of its own: iterations, learning rate; in the working copy's
    order) or (model variable, slot name). Found by building one on one-element stand-ins."""
    cached = getattr(sharded, "_hvdk8s_reference", None)
    if cached is not None:
        return cached
    model = sharded._hvdk8s_model
    stand_ins = [keras.Variable(np.zeros(1, dtype=tf.as_dtype(v.dtype).as_numpy_dtype), trainable=False,
                                name=f"hvdk8s_stand_in_{i}") for i, v in enumerate(model)]
    plain = sharded._hvdk8s_plain_cls.from_config(_plain(sharded).get_config())
    slots = _record_slots(plain)
    plain.build(stand_ins)
    index = {id(s): i for i, s in enumerate(stand_ins)}
    layout = [None if id(v) not in slots else (index[id(slots[id(v)][0])], slots[id(v)][1]) for v in plain.variables]
    own = list(sharded._variables) if isinstance(sharded, keras.optimizers.LossScaleOptimizer) else []
    work_plain = [v for v in sharded._hvdk8s_work.variables if id(v) not in sharded._hvdk8s_slots]
    if layout.count(None) != len(work_plain):
        raise ValueError(f"shard_optimizer_state: {type(plain).__name__} keeps state that is not per variable "
                         "in a way the working copy on the shards does not; it cannot be sharded")
    result = (own, layout)
    object.__setattr__(sharded, "_hvdk8s_reference", result)
    return result
