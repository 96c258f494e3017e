"""Horovod for TensorFlow 2 with Keras 3: the same verbs, parameters and meaning as `hvdk8s.torch`
(the contract in hvdk8s/_adapter.py), plus Keras callbacks and mixed precision.

Horovod 0.28.1's own Keras layer (`horovod.tensorflow.keras`, `DistributedGradientTape`) calls
`Variable.ref()`, which Keras 3 variables lack. This module builds on Horovod's core TensorFlow ops
only (grouped_allreduce, broadcast, fp16 compression), which work with TF 2.16+ and Keras 3 (and so
does hvdk8s.horovod.tensorflow, Horovod's own TF2 API for existing Horovod scripts, built on this module):

    import keras, hvdk8s.tensorflow as htf
    htf.init()
    htf.set_precision("bf16")                      # optional, before building the model
    model = ...
    optimizer = htf.distribute(model, keras.optimizers.SGD(htf.scaled_learning_rate(0.05)))
    model.compile(optimizer=optimizer, loss=..., jit_compile=False)   # Horovod ops do not run under XLA
    model.fit(data, callbacks=htf.callbacks(), verbose=htf.verbose())

The distributed optimizer averages gradients inside `optimizer.apply`, which both `model.fit` and a
custom `GradientTape` loop (`optimizer.apply(grads, model.trainable_variables)`) go through; with
backward_passes_per_step > 1, once per update, on the accumulated gradients (per micro-batch for a
LossScaleOptimizer, see below). A built model's variables and the optimizer's state are broadcast from
root_rank by `distribute` itself, so a custom loop is consistent from its first step; for a model built
later, `callbacks()` broadcasts when `fit` starts (or call `broadcast_state` yourself).

Gradient clipping: the optimizer's own `global_clipnorm` (or `clipnorm`) acts inside `apply` after the
allreduce, i.e. on the gradients averaged over all ranks — as one process on the whole batch would.

Mixed precision: `set_precision("bf16")` needs nothing else. For `set_precision("fp16")` wrap the plain
optimizer in `keras.optimizers.LossScaleOptimizer` and distribute that wrapper; put `global_clipnorm`
on the inner optimizer, which sees the gradients after unscaling. The allreduce then runs before the
loss-scale optimizer's finiteness check, so every rank sees the same averaged gradients and takes the
same branch (step or skip): a non-finite gradient on one rank makes all of them skip the step and
halve the scale. (An allreduce inside the inner optimizer would be skipped by the ranks whose local
gradients overflowed, and the others would wait for it forever.) In a custom loop, scale the loss
with `optimizer.scale_loss(loss)` before taking gradients; `model.fit` does that itself.
"""
from __future__ import annotations

import functools
import inspect
import json
import sys
from typing import Any, Callable, Optional, Sequence, Union

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState

from hvdk8s import (_adapter, _tf_powersgd, _tf_sharded, checkpoint as _checkpoint, compression as _compression,
                    metrics as _metrics, precision as _precision)
from hvdk8s._adapter import CONTRACT
from hvdk8s.schedule import warmup_lr

rank, size, local_rank, local_size, cross_size = hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_size
Average, Sum = hvd.Average, hvd.Sum

_COMPRESSORS = {"fp16": hvd.Compression.fp16, "none": hvd.Compression.none}
# The functions a user's own tf.function calls (an optimizer's apply, allreduce_gradients, ...) run as
# written, not converted by autograph: they branch on Python values only and use tf.cond where a tensor
# decides, which is how model.fit runs them already (Keras's code is not converted, nor what it calls).
# Converted, autograph rewrote each of them and the Horovod functions below them in every process that
# traced them, and ran them through its call wrappers: unconverted, the 2 ranks of
# tests/ranks/sharded_tf.py (22 traced steps) took 25 CPU-s instead of 38 (2026-12-05).
_as_written = tf.autograph.experimental.do_not_convert
_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}  # keys: precision.CHOICES


def init(threads_per_rank: Optional[int] = None) -> None:
    """Start Horovod and give this rank its share of the machine: on GPU the device of the local rank
    (with memory growth), on CPU `threads_per_rank` intra-op threads (default: cores / local ranks)."""
    _adapter.die_with_parent()
    # With the tuning profile a launcher did not give (hvdk8s/tuning.py): it depends on whether a GPU is seen.
    _adapter.start_horovod(hvd, gpus=bool(tf.config.list_physical_devices("GPU")))
    share_machine(threads_per_rank)


def share_machine(threads_per_rank: Optional[int] = None) -> None:
    """Give this (started) rank its share of the machine, as `init` does. TensorFlow takes these settings
    only before its runtime starts (the first tensor): later, it raises RuntimeError."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[hvd.local_rank() % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        return
    tf.config.threading.set_intra_op_parallelism_threads(_adapter.cpu_threads(threads_per_rank, hvd.local_size()))
    tf.config.threading.set_inter_op_parallelism_threads(1)


def set_precision(precision: str) -> None:
    """Keras 3's global dtype policy: 'fp32' (float32), 'bf16' (mixed_bfloat16) or 'fp16'
    (mixed_float16; distribute a LossScaleOptimizer). Layers take it when built: call this first."""
    if precision not in _precision.CHOICES:
        raise ValueError(f"precision must be one of {', '.join(_precision.CHOICES)}, got {precision!r}")
    keras.mixed_precision.set_dtype_policy(_POLICIES[precision])


def is_rank0() -> bool:
    return hvd.rank() == 0


def log(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only, flushed at once."""
    _adapter.rank0_print(hvd.rank(), *args, **kwargs)


def verbose() -> int:
    """Keras `verbose` for fit/evaluate: progress from rank 0 only."""
    return 1 if hvd.rank() == 0 else 0


def resolve_compression(choice: str = "auto") -> str:
    """'fp16' or 'none': `auto` is fp16 for jobs that span more than one node (hvdk8s.compression)."""
    return _compression.resolve(choice, nodes=hvd.cross_size())


def scaled_learning_rate(base: float, rule: str = "linear", backward_passes_per_step: int = 1) -> float:
    """`base` (the rate for one rank) grown by `rule` with ranks x backward_passes_per_step."""
    return _adapter.scaled_learning_rate(base, rule, hvd.size(), backward_passes_per_step)


def compressor(compression: Any = "auto"):
    """Horovod's compressor for `compression`: 'auto', 'fp16', 'none', or a compressor itself
    (`horovod.tensorflow.Compression.fp16`, or any class with compress/decompress)."""
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        return compression
    if compression == "powersgd":  # it keeps state per variable: the optimizer's, not one allreduce's
        raise ValueError(f"compression 'powersgd' is an optimizer's (hvdk8s.tensorflow.distribute), not one "
                         f"allreduce's; here choose one of {', '.join(['auto', *_COMPRESSORS])}")
    return _COMPRESSORS[resolve_compression(compression)]


@_as_written
def allreduce_gradients(grads: Sequence[Optional[tf.Tensor]], compression: Any = "auto", op=None,
                        sparse_as_dense: bool = True, **horovod_options: Any) -> list:
    """Average gradients over all ranks in one grouped allreduce (None entries pass through).
    compression: as `compressor`. sparse_as_dense=False keeps IndexedSlices (embedding gradients) sparse:
    Horovod allgathers their rows and indices instead. horovod_options (prescale_factor, postscale_factor,
    process_set, device_dense, device_sparse) go to hvd.grouped_allreduce; a rank outside `process_set`
    keeps its own gradients, as Horovod's DistributedGradientTape does."""
    process_set = horovod_options.get("process_set")
    if _adapter.alone(hvd.size()) or (process_set is not None and not process_set.included()):
        return list(grads)  # not elastic: there the size may grow later, and the traced step must reduce then
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    tensors = [grads[i] if isinstance(grads[i], tf.IndexedSlices) and not sparse_as_dense
               else tf.convert_to_tensor(grads[i]) for i in present]  # IndexedSlices -> dense
    reduced = hvd.grouped_allreduce(tensors, op=hvd.Average if op is None else op,
                                    compression=compressor(compression), **horovod_options)
    out = list(grads)
    for i, g in zip(present, reduced):
        out[i] = g
    return out


class _Distributed:
    """Mixed into a Keras optimizer class (through one of the two below): average gradients across
    ranks before the optimizer uses them, i.e. before its clipping, loss-scale check and update."""

    _hvdk8s_reduce: dict = {}
    _hvdk8s_scale_local = True  # a local variable's gradient divided by the ranks' number (Horovod's default)
    _hvdk8s_local: frozenset = frozenset()  # ids of the variables registered local
    _hvdk8s_reduced_outside = False  # within an apply of a LossScaleOptimizer around it (loss_scaled)

    def register_local_var(self, var) -> None:
        """Horovod's: `var`'s gradient stays this rank's own, not reduced over the ranks (divided by their
        number, unless the optimizer was made with scale_local_gradients=False)."""
        # object.__setattr__: Keras's own would track what is set (ids here) as the optimizer's state.
        object.__setattr__(self, "_hvdk8s_local", self._hvdk8s_local | {id(var)})

    def _hvdk8s_allreduce(self, grads: list, local: Optional[Sequence[bool]] = None,
                          variables: Optional[Sequence] = None) -> list:
        """GRADS (of VARIABLES) reduced over the ranks, but those LOCAL marks (this rank's own, scaled as
        Horovod does); through PowerSGD where the optimizer compresses so."""
        if isinstance(self, _tf_powersgd.PowerSGD):
            if local and any(local):
                raise ValueError("register_local_var: not with compression 'powersgd' (its error feedback "
                                 "assumes every gradient is averaged)")
            return self._hvdk8s_powersgd_reduce(list(grads), variables)
        if not local or not any(local):
            return allreduce_gradients(grads, **self._hvdk8s_reduce)
        if len(local) != len(grads):
            raise ValueError("register_local_var: Keras applied other gradients than it was given (a variable "
                             "it overwrites with its gradient?); local variables cannot be told apart here")
        shared = [i for i, own in enumerate(local) if not own]
        out = list(grads)
        for i, g in zip(shared, allreduce_gradients([grads[i] for i in shared], **self._hvdk8s_reduce)):
            out[i] = g
        if self._hvdk8s_scale_local:
            process_set = self._hvdk8s_reduce.get("process_set")
            ranks = hvd.size_op(process_set_id=process_set.process_set_id) if process_set else hvd.size_op()
            for i, own in enumerate(local):
                g = out[i]
                if own and isinstance(g, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(g.values / tf.cast(ranks, g.values.dtype), g.indices, g.dense_shape)
                elif own and g is not None:
                    out[i] = g / tf.cast(ranks, g.dtype)
        return out

    def _hvdk8s_local_marks(self, grads, trainable_variables) -> list[bool]:
        """Which of the gradients Keras keeps (those that are not None, in order) belong to local variables."""
        if not self._hvdk8s_local:
            return []
        variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
        return [id(v) in self._hvdk8s_local for g, v in zip(grads, variables) if g is not None]


class _ReduceBeforeClip(_Distributed):
    """A plain optimizer's: Keras 3 calls `_clip_gradients` once per update, on the very gradients it
    is about to apply (with gradient_accumulation_steps, the mean of the accumulated micro-batches), just
    before clipping and weight decay. Reducing there costs one allreduce per update, not one per
    micro-batch. (Variables that Keras overwrites with their gradient, float8 scaling state, are set
    before it and are not reduced.)"""

    _hvdk8s_in_apply = False
    _hvdk8s_marks: list = []

    @_as_written
    def apply(self, grads, trainable_variables=None):
        if self._hvdk8s_reduced_outside:  # the LossScaleOptimizer around it has reduced them
            return super().apply(grads, trainable_variables)
        # Reduce only within this apply (also while model.fit traces it): the base class's apply called
        # directly, `keras.optimizers.SGD.apply(opt, ...)`, stays a local step, as it always was.
        grads = list(grads)
        object.__setattr__(self, "_hvdk8s_marks", self._hvdk8s_local_marks(grads, trainable_variables))
        self._hvdk8s_in_apply = True
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._hvdk8s_in_apply = False

    def _backend_apply_gradients(self, grads, trainable_variables):
        # the variables of the gradients _clip_gradients gets (Keras has dropped those without one)
        object.__setattr__(self, "_hvdk8s_applied", list(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if self._hvdk8s_in_apply:
            grads = self._hvdk8s_allreduce(list(grads), self._hvdk8s_marks, getattr(self, "_hvdk8s_applied", None))
        return super()._clip_gradients(grads)


class _ReduceInApply(_Distributed):
    """A LossScaleOptimizer's: every micro-batch is reduced in `apply`, before the finiteness check, so
    that all ranks see the same gradients and take the same branch. Once per update inside the inner
    optimizer would deadlock: a rank whose local gradients overflowed skips the inner apply, and with it
    the allreduce that the other ranks wait in (and its accumulation would fall out of step)."""

    @_as_written
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        marks = self._hvdk8s_local_marks(grads, trainable_variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
        reduced = self._hvdk8s_allreduce([grads[i] for i in present], marks, [variables[i] for i in present])
        for i, g in zip(present, reduced):
            grads[i] = g
        return super().apply(grads, trainable_variables)


class _ReduceAroundInner(_ReduceInApply):
    """The LossScaleOptimizer that `loss_scaled` puts around a distributed optimizer: it reduces every
    micro-batch before its overflow check (as _ReduceInApply), and within its apply the inner optimizer,
    which would reduce again, takes the gradients as they are. The inner optimizer stays the user's own
    object (its state, its learning rate, its local variables: registered on either, held by the inner)."""

    _hvdk8s_local = property(lambda self: self.inner_optimizer._hvdk8s_local,
                             lambda self, ids: object.__setattr__(self.inner_optimizer, "_hvdk8s_local", ids))

    @_as_written
    def apply(self, grads, trainable_variables=None):
        inner = self.inner_optimizer
        object.__setattr__(inner, "_hvdk8s_reduced_outside", True)  # read while apply runs or is traced
        try:
            return super().apply(grads, trainable_variables)
        finally:
            object.__setattr__(inner, "_hvdk8s_reduced_outside", False)


def distribute(model: keras.Model, optimizer: keras.optimizers.Optimizer, *, compression: str = "auto",
               backward_passes_per_step: int = 1, op=None, root_rank: int = 0, broadcast: bool = True,
               shard_optimizer_state: int = 0, powersgd: Optional[dict] = None,
               **horovod_options: Any) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class, settings and state) whose updates use gradients averaged over
    all ranks; if `model` is built, root_rank's model variables and optimizer state are broadcast now
    (broadcast=False: not; elastic training's `ElasticState` syncs the ranks instead).

    compression: 'auto', 'fp16' or 'none'. backward_passes_per_step > 1 accumulates that many batches
    per update (Keras 3's gradient_accumulation_steps). Other keyword arguments (prescale_factor,
    postscale_factor, process_set) go to horovod.tensorflow.grouped_allreduce. A LossScaleOptimizer is
    distributed as a whole (allreduce before its finiteness check); its inner optimizer stays plain.
    compression 'powersgd': low-rank factors with error feedback (hvdk8s._tf_powersgd), `powersgd` its
    settings ({"rank": 4, "start_step": 10, "min_compression_rate": 2.0}); op Average only, no other
    Horovod options. shard_optimizer_state: 0 (every rank holds the whole optimizer state), 1 or 2 (each
    rank holds and updates 1/N of it, and of the gradients: hvdk8s._tf_sharded; the two stages are the same
    here, as Keras keeps no gradients between steps); compression as above, op Average only, no other
    Horovod options; clip by global_clipnorm (clipnorm clips each tensor alone, and a shard holds parts)."""
    if shard_optimizer_state not in (0, 1, 2):
        raise ValueError(f"shard_optimizer_state must be 0, 1 or 2, got {shard_optimizer_state!r}")
    if powersgd is not None and not _is_powersgd(compression):
        raise ValueError("powersgd settings given, but compression is not 'powersgd'")
    if shard_optimizer_state and _is_powersgd(compression):
        raise ValueError("compression 'powersgd' and shard_optimizer_state: one or the other (a sharded "
                         "optimizer reduce-scatters whole gradients)")
    dist = distributed_optimizer(optimizer, {"compression": compression, "op": op, **horovod_options},
                                 backward_passes_per_step, model.trainable_variables,
                                 powersgd=_tf_powersgd.settings(powersgd) if _is_powersgd(compression) else None,
                                 shard_optimizer_state=shard_optimizer_state)
    if model.built and broadcast:
        broadcast_state(model, dist, root_rank)
    return dist


def _is_powersgd(compression: Any) -> bool:
    return isinstance(compression, str) and compression == "powersgd"


class _MicroBatchIterations:
    """`iterations` counted in micro-batches under gradient accumulation, as tf.keras 2 optimizers under
    Horovod's backward_passes_per_step counted it (Keras 3 counts updates): the learning-rate schedules
    see the same count either way, but Adam's bias correction at the k-th update uses k x steps, not k."""

    @property
    def iterations(self):
        return self._iterations


def _named_like(cls: type, bases: tuple, attrs: Optional[dict] = None) -> type:
    """A subclass of `cls` with `bases` first, named and placed as `cls`, so that a saved model names that
    class and loads anywhere."""
    return type(cls.__name__, (*bases, cls), {**(attrs or {}), "__module__": cls.__module__,
                                               "__qualname__": cls.__qualname__})


def distributed_optimizer(optimizer: keras.optimizers.Optimizer, reduce: dict, backward_passes_per_step: int = 1,
                          variables: Optional[Sequence] = None, scale_local_gradients: bool = True,
                          count_micro_batches: bool = False, powersgd: Optional[dict] = None,
                          shard_optimizer_state: int = 0) -> keras.optimizers.Optimizer:
    """`distribute`'s copy of `optimizer`, without a model: `reduce` holds allreduce_gradients' keyword
    arguments. A built optimizer's state is carried over (built for `variables`, default the ones it was
    built for). scale_local_gradients: whether `register_local_var`'s gradients are divided by the ranks'
    number, as Horovod's option. count_micro_batches: with backward_passes_per_step > 1, `iterations`
    counts micro-batches as under Horovod (`_MicroBatchIterations`), not Keras 3's updates."""
    if isinstance(optimizer, (_Distributed, _tf_sharded.Sharded)):
        raise ValueError("optimizer is already distributed")
    lso = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if lso and isinstance(optimizer.inner_optimizer, _Distributed):
        raise ValueError("distribute the LossScaleOptimizer, not its inner optimizer: ranks whose gradients "
                         "overflow would skip the inner optimizer's allreduce and the others would wait forever")
    options = {k: v for k, v in reduce.items() if k not in ("compression", "op", "sparse_as_dense")}
    if shard_optimizer_state:
        _check_shardable(optimizer, reduce, options, count_micro_batches)
    if powersgd is not None:
        if reduce.get("op") not in (None, hvd.Average) or options:
            raise ValueError("compression 'powersgd' averages every gradient itself: Horovod's op and options "
                             f"({', '.join(sorted(options)) or 'op'}) do not apply")
    else:
        compressor(reduce.get("compression", "auto"))  # a bad choice fails here, not at the first step
    inspect.signature(hvd.grouped_allreduce).bind([], **options)  # likewise an unknown option
    mixin = _ReduceInApply if lso else _ReduceBeforeClip
    if powersgd is not None:
        mixin = (_tf_powersgd.PowerSGD, mixin)
    attrs = {}
    if shard_optimizer_state:
        mixin = _tf_sharded.Sharded
        attrs = {"_hvdk8s_plain_cls": type(optimizer.inner_optimizer if lso else optimizer),
                 "_hvdk8s_compression": compressor(reduce.get("compression", "auto"))}
    # The optimizer that accumulates (a LossScaleOptimizer's inner one) is the one whose count Adam reads.
    micro = (_MicroBatchIterations,) if count_micro_batches and backward_passes_per_step > 1 else ()
    mixins = mixin if isinstance(mixin, tuple) else (mixin,)
    dist_cls = _named_like(type(optimizer), (*mixins, *(() if lso else micro)),
                           {"_hvdk8s_reduce": dict(reduce), "_hvdk8s_scale_local": scale_local_gradients,
                            "_hvdk8s_powersgd": dict(powersgd or {}), **attrs})

    if lso:
        # Built directly rather than by from_config, which looks the inner class up by its registered
        # name and so misses a user's own optimizer class.
        inner = optimizer.inner_optimizer
        inner_config = inner.get_config()
        if backward_passes_per_step > 1:
            inner_config["gradient_accumulation_steps"] = backward_passes_per_step
        inner_cls = _named_like(type(inner), micro) if micro else type(inner)
        dist = dist_cls(inner_cls.from_config(inner_config), initial_scale=optimizer.initial_scale,
                        dynamic_growth_steps=optimizer.dynamic_growth_steps, name=optimizer.name)
    else:
        config = optimizer.get_config()
        if backward_passes_per_step > 1:
            config["gradient_accumulation_steps"] = backward_passes_per_step
        dist = dist_cls.from_config(config)
    _keep_weight_decay_exclusions(getattr(optimizer, "inner_optimizer", optimizer), getattr(dist, "inner_optimizer", dist))

    if optimizer.built:  # e.g. state restored from a checkpoint before distributing: keep it
        dist.build(list(variables) if variables is not None else _built_for(optimizer))
        if isinstance(dist, _tf_sharded.Sharded):  # the unsharded optimizer's variables are the format
            if [tuple(v.shape) for v in optimizer.variables] != dist.state_shapes():
                raise ValueError("the optimizer was built for other variables than model.trainable_variables")
            dist.reshard([np.asarray(v) for v in optimizer.variables])
            return dist
        mine, theirs = _state(dist), _state(optimizer)
        if [tuple(v.shape) for v in mine] != [tuple(v.shape) for v in theirs]:
            raise ValueError("the optimizer was built for other variables than model.trainable_variables")
        for m, t in zip(mine, theirs):
            m.assign(t)
    return dist


def is_distributed(optimizer: Any) -> bool:
    """Whether `optimizer` is one that `distribute` (or distributed_optimizer) made."""
    return isinstance(optimizer, (_Distributed, _tf_sharded.Sharded))


def loss_scaled(dist: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """A LossScaleOptimizer around `dist` (a distributed plain optimizer) that reduces before its overflow
    check: what Keras 3's compile should wrap it in under the mixed_float16 policy. Keras's own wrapper
    checks each rank's local gradients, and a rank whose gradients overflowed alone would skip the inner
    optimizer's allreduce while the others wait in it forever."""
    if isinstance(dist, (_tf_sharded.Sharded, _tf_powersgd.PowerSGD)):
        raise ValueError("under the mixed_float16 policy, distribute a keras.optimizers.LossScaleOptimizer "
                         "yourself: Keras's compile would wrap this distributed optimizer in one, and a rank "
                         "whose gradients overflow would skip the collective the others wait in")
    cls = _named_like(keras.optimizers.LossScaleOptimizer, (_ReduceAroundInner,),
                      {"_hvdk8s_reduce": dict(dist._hvdk8s_reduce), "_hvdk8s_scale_local": dist._hvdk8s_scale_local})
    return cls(dist, name="loss_scale_optimizer")


def _keep_weight_decay_exclusions(source, target) -> None:
    """What `exclude_from_weight_decay` set on `source` (which get_config does not carry), on `target`."""
    for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(source, attr):
            object.__setattr__(target, attr, getattr(source, attr))
    object.__setattr__(target, "_exclude_from_weight_decay_cache", {})


def _check_shardable(optimizer, reduce: dict, options: dict, count_micro_batches: bool) -> None:
    plain = getattr(optimizer, "inner_optimizer", optimizer)
    why = ("Horovod's op and options do not apply (it averages by reduce-scatter)"
           if reduce.get("op") not in (None, hvd.Average) or options else
           "clipnorm clips each tensor by its own norm, and a rank holds parts of tensors: use global_clipnorm"
           if plain.clipnorm else
           "use_ema keeps averages of the whole variables on every rank" if plain.use_ema else
           "count_micro_batches does not apply" if count_micro_batches else None)
    if why:
        raise ValueError(f"shard_optimizer_state: {why}")


def _state(optimizer: keras.optimizers.Optimizer) -> list:
    """An optimizer's variables but its gradient accumulators (backward_passes_per_step > 1 adds them)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    skipped = {id(a) for a in getattr(inner, "_accumulated_gradients", None) or ()}
    skipped |= getattr(optimizer, "_hvdk8s_powersgd_variables", frozenset())  # PowerSGD's: not the optimizer's own
    return [v for v in optimizer.variables if id(v) not in skipped]


def _built_for(optimizer: keras.optimizers.Optimizer) -> list:
    """The variables a built Keras 3 optimizer was built for (a LossScaleOptimizer: its inner one's)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return list(inner._trainable_variables)


@_as_written
def broadcast_variables(variables: Sequence, root_rank: int = 0, name: str = "hvdk8s.bcast",
                        **horovod_options: Any) -> None:
    """Assign root_rank's values to `variables` (Keras 3 or tf.Variables) on every rank: one broadcast
    per dtype, of all variables of that dtype flattened into one buffer (one collective, not hundreds).
    A rank alone has root_rank's values already. horovod_options (process_set) go to hvd.broadcast.
    Inside a tf.function Horovod names each broadcast after its tensor, so that two calls in one
    function do not share a name."""
    if _adapter.alone(hvd.size()):
        return
    groups: dict[str, list] = {}
    for v in variables:
        groups.setdefault(tf.as_dtype(v.dtype).name, []).append(v)
    for dtype, group in groups.items():
        values = [tf.convert_to_tensor(v.value if isinstance(v, keras.Variable) else v) for v in group]
        flat = hvd.broadcast(tf.concat([tf.reshape(t, [-1]) for t in values], 0), root_rank,
                             name=f"{name}.{dtype}" if tf.executing_eagerly() else None, **horovod_options)
        for v, t, part in zip(group, values, tf.split(flat, [int(np.prod(t.shape)) for t in values])):
            v.assign(tf.reshape(part, t.shape))


def broadcast_state(model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer] = None,
                    root_rank: int = 0) -> None:
    """Make every rank hold root_rank's model variables and optimizer state (building the optimizer's
    slots first if it has none yet, so they exist everywhere)."""
    if isinstance(optimizer, _tf_sharded.Sharded):  # the model first: the shards are taken from it
        broadcast_variables(model.variables, root_rank, "hvdk8s.state")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
            broadcast_variables(optimizer.variables, root_rank, "hvdk8s.state.own")  # a fresh state: no slots
        else:
            optimizer.reshard(broadcast_arrays(optimizer.gathered_state(), root_rank, "hvdk8s.state.sharded"))
        return
    variables = list(model.variables)
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables += optimizer.variables
    broadcast_variables(variables, root_rank, "hvdk8s.state")


def broadcast_arrays(arrays: Sequence[np.ndarray], root_rank: int = 0, name: str = "hvdk8s.arrays") -> list[np.ndarray]:
    """root_rank's `arrays` on every rank (the others pass arrays of the same shapes and dtypes): one
    broadcast per dtype."""
    if _adapter.alone(hvd.size()):
        return [np.asarray(a) for a in arrays]
    out: list = [None] * len(arrays)
    groups: dict[str, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(np.asarray(a).dtype.str, []).append(i)
    for dtype, members in groups.items():
        flat = np.concatenate([np.asarray(arrays[i]).reshape(-1) for i in members])
        got = hvd.broadcast(tf.convert_to_tensor(flat), root_rank, name=f"{name}.{dtype}").numpy()
        offset = 0
        for i in members:
            shape = np.shape(arrays[i])
            n = int(np.prod(shape))
            out[i] = got[offset:offset + n].reshape(shape)
            offset += n
    return out


def allreduce(value, op=None, name: Optional[str] = None) -> np.ndarray:
    """Allreduce a number or array in float64 (so sums of counts stay exact). A rank alone gets a copy
    at once (any op of one value is that value) rather than waiting for Horovod's cycle."""
    if _adapter.alone(hvd.size()):
        return np.array(value, dtype=np.float64)
    t = tf.convert_to_tensor(np.asarray(value, dtype=np.float64))
    return hvd.allreduce(t, op=hvd.Average if op is None else op, name=name).numpy()


def metric_average(value, name: Optional[str] = None) -> float:
    """The mean of a scalar metric over all ranks, the same on every rank."""
    return float(allreduce(value, hvd.Average, name))


def metric_sum(value, name: Optional[str] = None) -> float:
    return float(allreduce(value, hvd.Sum, name))


# --- checkpoints -----------------------------------------------------------------------------------

def _write_npz(payload: dict, path) -> None:
    arrays = {f"model/{i:05d}": a for i, a in enumerate(payload["model"])}
    arrays.update({f"optimizer/{i:05d}": a for i, a in enumerate(payload["optimizer"])})
    with open(path, "wb") as f:  # extra as a JSON string: an npz that loads without pickle
        np.savez(f, epoch=np.int64(payload["epoch"]), extra=np.array(json.dumps(payload["extra"])), **arrays)


def _read_npz(path) -> dict:
    with np.load(path) as z:
        keys = sorted(z.files)
        return {"epoch": int(z["epoch"]),
                "extra": json.loads(str(z["extra"])) if "extra" in z.files else {},
                "model": [z[k] for k in keys if k.startswith("model/")],
                "optimizer": [z[k] for k in keys if k.startswith("optimizer/")]}


def _mismatch(what: str, here: Sequence[tuple], saved: Sequence) -> Optional[str]:
    """Why arrays `saved` cannot be loaded where arrays of shapes `here` go (None if they can)."""
    if len(here) != len(saved):
        return f"{len(saved)} {what} arrays, this {what} has {len(here)}"
    for i, (shape, a) in enumerate(zip(here, saved)):
        if tuple(shape) != tuple(a.shape):
            return f"{what} array {i} has shape {tuple(a.shape)}, this {what} {tuple(shape)}"
    return None


def save_checkpoint(directory: str, epoch: int, model: keras.Model, optimizer: keras.optimizers.Optimizer,
                    extra: Optional[dict] = None, keep: int = 3):
    """Rank 0 writes model, optimizer state and `extra` (a JSON-able dict) for `epoch` atomically; other
    ranks do nothing. Returns the path on rank 0, None elsewhere."""
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict, got {type(extra).__name__} (keep is a keyword argument)")
    if isinstance(optimizer, _tf_powersgd.PowerSGD) and optimizer.built:
        optimizer.average_errors()  # collective: rank 0's errors become the ranks' mean, the whole state
    sharded = isinstance(optimizer, _tf_sharded.Sharded)
    if sharded and not optimizer.built:
        optimizer.build(model.trainable_variables)
    state = optimizer.gathered_state() if sharded else None  # collective: the unsharded optimizer's format
    if hvd.rank() != 0:
        _metrics.current().checkpointed()  # rank 0 writes it now
        return None
    if not optimizer.built:  # save the slots' layout a resume expects
        optimizer.build(model.trainable_variables)
    payload = {"epoch": epoch, "extra": extra or {}, "model": [np.asarray(w) for w in model.get_weights()],
               "optimizer": state if sharded else [np.asarray(v) for v in optimizer.variables]}
    path = _checkpoint.save(directory, epoch, payload, _write_npz, keep)
    _metrics.current().checkpointed()
    return path


def load_checkpoint(directory: str, model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer] = None,
                    root_rank: int = 0, broadcast: bool = True) -> tuple[int, dict]:
    """Resume from the newest valid checkpoint in `directory`, read by root_rank and broadcast (the
    directory need not be shared between nodes). Returns (epoch, extra) with extra["path"] the file read;
    (0, {}) when there is none. A file whose arrays do not fit this model's (and optimizer's) variables
    is skipped with a message on stderr. broadcast=False: no collective; root_rank alone reads and
    restores, the others get (0, {}) (elastic training: `ElasticState` syncs)."""
    if optimizer is not None and not optimizer.built:  # its slots must exist to take the saved state
        optimizer.build(model.trainable_variables)

    sharded = isinstance(optimizer, _tf_sharded.Sharded)
    shapes = (optimizer.state_shapes() if sharded else [tuple(v.shape) for v in optimizer.variables]
              ) if optimizer is not None else []

    def fits(payload: dict) -> bool:
        why = _mismatch("model", [tuple(w.shape) for w in model.weights], payload["model"])
        if why is None and optimizer is not None:
            why = _mismatch("optimizer", shapes, payload["optimizer"])
        if why:
            print(f"hvdk8s: {why}", file=sys.stderr)
        return why is None

    found = None
    if hvd.rank() == root_rank:
        found = _checkpoint.load_latest(directory, _read_npz, valid=fits)
    epoch, extra = 0, {}
    if found is not None:
        epoch, path, payload = found
        model.set_weights(payload["model"])
        if sharded:
            optimizer.reshard(payload["optimizer"])
            object.__setattr__(optimizer, "_hvdk8s_loaded", payload["optimizer"])  # for an ElasticState's sync
        elif optimizer is not None:
            for var, value in zip(optimizer.variables, payload["optimizer"]):
                var.assign(value)
        extra = {**payload["extra"], "path": str(path)}
    if not broadcast or _adapter.alone(hvd.size()):
        return epoch, extra
    epoch, extra = hvd.broadcast_object((epoch, extra), root_rank, name="hvdk8s.resume")
    if sharded:  # root_rank's whole state as read (the other ranks hold none of it yet)
        broadcast_variables(model.variables, root_rank, "hvdk8s.state")
        if "path" in extra:
            mine = payload["optimizer"] if found is not None else optimizer.state_templates()
            optimizer.reshard(broadcast_arrays(mine, root_rank, "hvdk8s.state.sharded"))
        else:
            optimizer.reshard(broadcast_arrays(optimizer.gathered_state(), root_rank, "hvdk8s.state.sharded"))
        return epoch, extra
    broadcast_state(model, optimizer, root_rank)
    return epoch, extra


# --- elastic training ----------------------------------------------------------------------------

class VariablesState(ObjectState):
    """Horovod elastic state of a list of variables (Keras 3 or tf.Variables) and any other attributes
    (epoch=..., ...): kept in memory at each `commit()` and synced from rank 0 when workers join or leave
    (`run_elastic`). After a failure every rank goes back to the last commit."""

    def __init__(self, variables: Sequence, **attrs: Any):
        self._variables = list(variables)
        self._saved = [np.array(v) for v in self._variables]
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **attrs)

    def save(self) -> None:
        self._saved = [np.array(v) for v in self._variables]
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._saved):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables, 0, "hvdk8s.elastic")
        super().sync()


class ElasticState(VariablesState):
    """`VariablesState` of a model's and optimizer's variables. (Horovod's own TensorFlowKerasState is for
    tf.keras, not Keras 3: hvdk8s.horovod.tensorflow.elastic has one for Keras 3.)"""

    def __init__(self, model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer] = None, **attrs: Any):
        if optimizer is not None and not optimizer.built:  # its slots must exist to be saved and synced
            optimizer.build(model.trainable_variables)
        self._model, self._optimizer = model, optimizer
        # A sharded optimizer's state is kept whole, in the unsharded format (each rank's shards depend on
        # the ranks there are): gathered at each commit, laid out again when the ranks change.
        self._sharded = isinstance(optimizer, _tf_sharded.Sharded)
        self._committed = getattr(optimizer, "_hvdk8s_loaded", None) if self._sharded else None
        super().__init__(list(model.variables) + (list(optimizer.variables) if optimizer is not None else []),
                         **attrs)
        if isinstance(optimizer, _tf_powersgd.PowerSGD):  # the lost ranks took their errors with them
            self.register_reset_callbacks([optimizer.reset_compression])
        if self._sharded:
            self.register_reset_callbacks([lambda: self._reshard(self._committed)])

    def _reshard(self, state) -> None:
        self._optimizer.reshard(state)
        self._model.train_function = None  # Keras traces its step again, for the new shards

    def save(self) -> None:
        if self._sharded:  # collective: every rank commits at the same step
            self._committed = self._optimizer.gathered_state()
        super().save()

    def restore(self) -> None:
        super().restore()
        if self._sharded and self._committed is not None:
            self._reshard(self._committed)

    def sync(self) -> None:
        super().sync()  # the model's variables and the optimizer's own (iterations, learning rate, loss scale)
        if self._sharded:  # then rank 0's committed state (none yet: the ranks' fresh ones), laid out anew
            committed = hvd.broadcast_object(self._committed is not None, 0, name="hvdk8s.elastic.committed")
            mine = ((self._committed if self._committed is not None else self._optimizer.state_templates())
                    if committed else self._optimizer.gathered_state())
            self._committed = broadcast_arrays(mine, 0, "hvdk8s.elastic.sharded")
            self._reshard(self._committed)


def run_elastic(func):
    """Decorate `func(state, ...)`, the training to run under Horovod elastic: on a change of workers
    every rank re-initialises Horovod, calls the state's reset callbacks, syncs and calls `func` again.
    Nothing before it may be collective (a joining worker runs only this). Unlike Horovod's TensorFlow
    wrapper, errors that are not Horovod's propagate (that one returns None for any other UnknownError)."""
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if "Horovod" in (e.message or ""):  # a collective broken by a lost rank
                raise HorovodInternalError(e) from e
            raise

    def reset() -> None:
        hvd.shutdown()
        hvd.init()

    return run_fn(wrapper, reset)


# --- Keras callbacks (what Horovod's Keras callbacks do, on Keras 3) -------------------------------

class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of training, give every rank root_rank's model variables and optimizer state
    (needed when the model was not yet built at `distribute`). A model that Keras builds only at its
    first batch (no Input, never called) has no variables to send before it: it gets them after that
    batch, as Horovod's callback did."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs=None):
        if getattr(self.model, "jit_compile", False):
            raise ValueError("compile the model with jit_compile=False: Horovod's TensorFlow ops have no "
                             "XLA kernels")
        if not self.done and self.model.built:
            self.broadcast()
            self.done = True

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self.broadcast()
            self.done = True

    def broadcast(self) -> None:
        broadcast_state(self.model, self.model.optimizer, self.root_rank)


class MetricAverage(keras.callbacks.Callback):
    """At the end of each epoch, replace every logged metric by its mean over the ranks."""

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
            values = allreduce([float(logs[k]) for k in names], hvd.Average, name=f"hvdk8s.metrics.{epoch}")
            logs.update(dict(zip(names, values.tolist())))


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramp the learning rate linearly from `initial_lr` to `target_lr` over the first warmup_epochs
    (Goyal et al. 2017), then hold it at `target_lr`."""

    def __init__(self, initial_lr: float, target_lr: float, warmup_epochs: float, steps_per_epoch: int):
        super().__init__()
        self.initial_lr, self.target_lr = initial_lr, target_lr
        self.warmup_steps = round(warmup_epochs * steps_per_epoch)
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        step = self.epoch * self.steps_per_epoch + batch
        if step <= self.warmup_steps:
            self.model.optimizer.learning_rate.assign(
                warmup_lr(step, self.warmup_steps, self.initial_lr, self.target_lr))


class Checkpoint(keras.callbacks.Callback):
    """Rank 0 saves model and optimizer every `interval_epochs` epochs (1-based epoch numbers).
    `extra`: a JSON-able dict stored with each checkpoint, or a function of the epoch returning one."""

    def __init__(self, directory: str, interval_epochs: int = 1, keep: int = 3, on_saved=None,
                 extra: Union[dict, Callable[[int], dict], None] = None):
        super().__init__()
        self.directory, self.interval, self.keep = directory, interval_epochs, keep
        self.on_saved, self.extra = on_saved, extra

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.interval == 0:
            extra = self.extra(epoch + 1) if callable(self.extra) else self.extra
            path = save_checkpoint(self.directory, epoch + 1, self.model, self.model.optimizer, extra,
                                   keep=self.keep)
            if path is not None and self.on_saved:
                self.on_saved(epoch + 1, path)


def metrics(port: Optional[int] = None, job=None) -> _metrics.Metrics:
    """This rank's Prometheus metrics, served from the first call on (after `init()`): on when the job
    has them on (`observability.metrics`) or a `port` is given; else a Metrics that records nothing.
    With `model.fit`, pass `MetricsCallback(batch_size)`; in a custom loop, record as with
    `hvdk8s.torch.metrics`."""
    return _adapter.metrics(hvd.rank(), hvd.local_rank(), hvd.local_size(), port, job)


class MetricsCallback(keras.callbacks.Callback):
    """Records each training batch of `model.fit` in this rank's metrics: step time, samples, and
    (at most once a second) the logged loss and accuracy. `samples`: samples per batch on this rank,
    or a function of the batch index. Keras reads data and reduces gradients inside its compiled step,
    so data and allreduce waits are not separated here (Horovod's timeline shows them)."""

    def __init__(self, samples: Union[int, Callable[[int], int]], metrics: Optional[_metrics.Metrics] = None):
        super().__init__()
        self.samples, self.metrics = samples, metrics

    def on_epoch_begin(self, epoch, logs=None):
        (self.metrics or _metrics.current()).begin_epoch(epoch + 1)

    def on_epoch_end(self, epoch, logs=None):
        (self.metrics or _metrics.current()).end_epoch()

    def on_train_batch_end(self, batch, logs=None):
        m = self.metrics or _metrics.current()
        if m.enabled:
            logs = logs or {}
            n = self.samples(batch) if callable(self.samples) else self.samples
            m.step(n, loss=_logged(logs, "loss"), accuracy=_logged(logs, "accuracy"))


def _logged(logs: dict, name: str) -> Optional[Callable[[], float]]:
    return (lambda: float(logs[name])) if name in logs else None


def callbacks(root_rank: int = 0) -> list:
    """The callbacks every distributed `model.fit` needs: initial broadcast, metric averaging."""
    return [BroadcastInitialState(root_rank), MetricAverage()]


__all__ = [*CONTRACT, "set_precision", "verbose", "callbacks", "allreduce_gradients", "broadcast_variables",
           "BroadcastInitialState", "MetricAverage", "LearningRateWarmup", "Checkpoint", "MetricsCallback"]
