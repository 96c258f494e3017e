"""Horovod 0.28.1's TensorFlow 2 API (`horovod.tensorflow`) on TensorFlow 2.16+ and Keras 3:

    import hvdk8s.horovod.tensorflow as hvd          # was: import horovod.tensorflow as hvd

A module of its own rather than `hvdk8s.tensorflow`, because the two differ where they share a name
(here `allreduce` takes and returns a tensor as Horovod's does, `init` takes Horovod's arguments; there
`allreduce` returns a float64 array for metrics and `init` the threads per rank), and because its path
mirrors Horovod's, so that a script changes by a prefix (`horovod.tensorflow.keras` is
`hvdk8s.horovod.tensorflow.keras`).

- Horovod's own, unchanged (they take tensors, which Keras 3 did not change): the collectives
  (allreduce, grouped_allreduce, allgather, broadcast, alltoall, reducescatter, the *_object ones),
  Compression, the ops (Average, Sum, ...), process sets, rank/size queries, the timeline, join.
- Rebuilt on `hvdk8s.tensorflow` for Keras 3's variables and optimizers, with Horovod's signatures
  and results: init, broadcast_variables, DistributedGradientTape, PartialDistributedGradientTape,
  DistributedOptimizer, SyncBatchNormalization, elastic.
- Refused, with the replacement: TensorFlow 1's graph-collection names (broadcast_global_variables,
  BroadcastGlobalVariablesHook).

Importing it also lets Keras 3 accept the tf.keras 2 spellings Horovod's scripts use
(`optimizer.variables()`, `optimizer.lr`, `compile(experimental_run_tf_function=...)`): _keras2.py.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import horovod.tensorflow as _hvd
import keras as _keras  # `keras` is this package's submodule (horovod.tensorflow.keras)
import tensorflow as tf
from horovod.tensorflow import (  # noqa: F401  Horovod's own names, re-exported unchanged
    Adasum, Average, Compression, Max, Min, Product, ProcessSet, Sum, add_process_set, allgather, allgather_object,
    alltoall, allreduce, broadcast, broadcast_, broadcast_object, broadcast_object_fn, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set, grouped_allgather,
    grouped_allreduce, grouped_reducescatter, is_homogeneous, is_initialized, join, local_rank, local_rank_op,
    local_size, local_size_op, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, process_set_included_op,
    rank, rank_op, reducescatter, remove_process_set, rocm_built, shutdown, size, size_op, start_timeline,
    stop_timeline)

from hvdk8s import _adapter, tensorflow as _htf
from hvdk8s.horovod.tensorflow import _keras2

_keras2.install(_htf.is_distributed, _htf.loss_scaled)


def init(comm=None, process_sets=None) -> None:
    """Horovod's init, plus what hvdk8s.tensorflow.init does: the rank ends with its launcher, and gets
    its share of the machine (on CPU, cores / local ranks intra-op threads; on GPU, its local rank's
    device) unless TensorFlow's runtime has already started."""
    _adapter.die_with_parent()
    _adapter.start_horovod(_hvd, gpus=bool(tf.config.list_physical_devices("GPU")), comm=comm,
                           process_sets=process_sets)
    try:
        _htf.share_machine()
    except RuntimeError:  # a tensor was made before init: TensorFlow keeps the settings it started with
        pass


_as_written = _htf._as_written  # what a user's tf.function calls runs unconverted (hvdk8s.tensorflow says why)


@_as_written
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False) -> None:
    """Give `variables` (Keras 3 variables, e.g. `model.variables` and `optimizer.variables`, or
    tf.Variables) root_rank's values on every rank of `process_set`. `inplace` is accepted for Horovod's
    signature: the result is the same (one flattened broadcast per dtype)."""
    _htf.broadcast_variables(list(variables), root_rank, "hvd.broadcast_variables", process_set=process_set)


def broadcast_global_variables(root_rank):
    raise NotImplementedError(
        "hvd.broadcast_global_variables reads TensorFlow 1's global-variables collection, which TensorFlow 2 "
        "and Keras 3 variables are not in; use hvd.broadcast_variables(model.variables, root_rank) and "
        "hvd.broadcast_variables(optimizer.variables, root_rank)")


class BroadcastGlobalVariablesHook:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "hvd.BroadcastGlobalVariablesHook is a TensorFlow 1 session hook (tf.estimator), which TensorFlow "
            "2.16+ removed; broadcast with hvd.broadcast_variables(model.variables, 0) and "
            "hvd.broadcast_variables(optimizer.variables, 0) after the first step, or use "
            "hvdk8s.horovod.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback with model.fit")


def _check_reduction(op, gradient_predivide_factor, num_groups, groups):
    """Horovod's checks of DistributedGradientTape's and DistributedOptimizer's options."""
    if gradient_predivide_factor != 1.0:
        if rocm_built():
            raise ValueError('gradient_predivide_factor not supported yet with ROCm')
        if op != Average:
            raise ValueError('gradient_predivide_factor not supported with op != Average')
    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.',
                      DeprecationWarning)
        groups = num_groups if groups is None else groups
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError('groups should be a non-negative integer or a list of list of tf.Variable.')


def _reduction(compression, sparse_as_dense, op, gradient_predivide_factor, process_set, device_dense,
               device_sparse, postscale: float = 1.0) -> dict:
    """hvdk8s.tensorflow.allreduce_gradients' arguments for Horovod's options. An average split by
    gradient_predivide_factor: times 1/factor before the sum, factor/size after it (Horovod's C++ applies
    the 1/size of Average). `groups` only chose how Horovod negotiated the tensors; here all gradients
    go in one group, one negotiation, with the same result."""
    split = gradient_predivide_factor if op == Average else 1.0
    return {"compression": compression, "op": op, "sparse_as_dense": sparse_as_dense,
            "prescale_factor": 1.0 / split, "postscale_factor": split * postscale, "process_set": process_set,
            "device_dense": device_dense, "device_sparse": device_sparse}


def _horovod_size(process_set):
    """The size local gradients are scaled by, as Horovod reads it (a tensor under elastic training)."""
    if int(os.environ.get("HOROVOD_ELASTIC", 0)):
        return size_op(process_set_id=process_set.process_set_id)
    return process_set.size()


class _DistributedTape:
    """Mixed into the class of the tape it wraps: `gradient` averages the gradients over the ranks (all
    but those of sources registered as local) before returning them. Sources are told apart by identity
    (Horovod used `Variable.ref()`, which Keras 3 variables lack)."""

    def __init__(self, tape, reduce: dict, process_set, scale_local_gradients: bool):
        super().__init__(tape._persistent, tape._watch_accessed_variables)
        self._tape = tape._tape  # the operations recorded by the tape it wraps
        self._hvd_reduce = reduce
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: dict[int, Any] = {}  # id -> source (kept, so that the id stays its own)

    def register_local_source(self, source) -> None:
        """Leave the gradient of `source` local: not averaged over the ranks (scaled by 1/size unless
        scale_local_gradients=False)."""
        self._local_sources[id(source)] = source

    @_as_written
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        grads = super().gradient(target, sources, output_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        shared = [i for i, s in enumerate(flat_sources) if id(s) not in self._local_sources]
        for i, g in zip(shared, _htf.allreduce_gradients([flat_grads[i] for i in shared], **self._hvd_reduce)):
            flat_grads[i] = g
        if self.scale_local_gradients and self._local_sources:
            n = _horovod_size(self.process_set)
            for i, s in enumerate(flat_sources):
                g = flat_grads[i]
                if id(s) in self._local_sources and g is not None:
                    flat_grads[i] = (tf.IndexedSlices(g.values / tf.cast(n, g.values.dtype), g.indices, g.dense_shape)
                                     if isinstance(g, tf.IndexedSlices) else g / tf.cast(n, g.dtype))
        return tf.nest.pack_sequence_as(grads, flat_grads)

    @_as_written
    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """(local (source, gradient) pairs, global ones), in the order of `sources`."""
        pairs = list(zip(sources, self.gradient(target, sources, output_gradients, use_generic_names)))
        return ([p for p in pairs if id(p[0]) in self._local_sources],
                [p for p in pairs if id(p[0]) not in self._local_sources])


@_as_written
def DistributedGradientTape(gradtape, device_dense='', device_sparse='', compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A tape that wraps `gradtape` (of its class): its `gradient` returns the gradients averaged (`op`)
    over the ranks of `process_set`, compressed on the wire by `compression`; sparse gradients stay
    sparse (allgathered) unless sparse_as_dense. gradient_predivide_factor splits the average:
    1/factor before the sum, factor/size after it."""
    _check_reduction(op, gradient_predivide_factor, num_groups, groups)
    cls = type(type(gradtape).__name__, (_DistributedTape, type(gradtape)), {})
    reduce = _reduction(compression, sparse_as_dense, op, gradient_predivide_factor, process_set, device_dense,
                        device_sparse)
    return cls(gradtape, reduce, process_set, scale_local_gradients)


@_as_written
def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='', compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose `local_layers` (Keras layers) keep their gradients local."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, _keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, _keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of _keras.layers.Layer type.")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A Keras 3 optimizer (a copy of `optimizer`: its class, settings and state) that averages the
    gradients over the ranks before it uses them, in `apply`/`apply_gradients` and so in `model.fit`.
    backward_passes_per_step > 1: gradients of that many batches are accumulated locally (Keras 3's
    gradient_accumulation_steps) and reduced once per update, summed (Horovod's default) or averaged
    (average_aggregated_gradients=True); `iterations` counts micro-batches, as under Horovod (so Adam's bias
    correction is Horovod's). A TensorFlow 1 optimizer (tf.compat.v1.train) goes to Horovod's
    own DistributedOptimizer, which still works for it."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return _hvd.DistributedOptimizer(
            optimizer, name, use_locking, device_dense, device_sparse, compression, sparse_as_dense,
            backward_passes_per_step, op, gradient_predivide_factor, average_aggregated_gradients, num_groups,
            groups, process_set, scale_local_gradients)
    if op == Adasum:
        raise ValueError('op == Adasum is not supported yet with Keras')
    return keras_optimizer(optimizer, device_dense, device_sparse, compression, sparse_as_dense,
                           gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
                           num_groups, groups, process_set, scale_local_gradients)


def keras_optimizer(optimizer, device_dense, device_sparse, compression, sparse_as_dense, gradient_predivide_factor,
                    op, backward_passes_per_step, average_aggregated_gradients, num_groups, groups, process_set,
                    scale_local_gradients):
    """DistributedOptimizer of a Keras 3 optimizer (horovod.tensorflow.keras's checks and options)."""
    if not isinstance(optimizer, _keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer takes a Keras 3 optimizer (_keras.optimizers.*) or a "
                        f"tf.compat.v1.train.Optimizer, got {type(optimizer).__name__}")
    if op != Average and op != Sum:
        raise ValueError('op currently only supports Average and Sum')
    _check_reduction(op, gradient_predivide_factor, num_groups, groups)
    # Keras 3 accumulates the mean of the micro-batches' gradients; Horovod's default reduces their sum.
    summed = backward_passes_per_step if backward_passes_per_step > 1 and not average_aggregated_gradients else 1
    reduce = _reduction(compression, sparse_as_dense, op, gradient_predivide_factor, process_set, device_dense,
                        device_sparse, postscale=float(summed))
    return _htf.distributed_optimizer(optimizer, reduce, backward_passes_per_step,
                                      scale_local_gradients=scale_local_gradients, count_micro_batches=True)


class SyncBatchNormalization(_keras.layers.BatchNormalization):
    """Batch normalization whose training statistics are those of the whole batch across the ranks (the
    mean and variance from the sums of every rank's samples; ranks may hold different batch sizes)."""

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError('SyncBatchNormalization does not support fused=True.')
        kwargs.setdefault('name', 'sync_batch_normalization')
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if mask is not None or size() == 1:
            return super()._moments(inputs, mask)
        x = tf.cast(inputs, tf.float32)
        axes = list(self._reduction_axes)
        count = tf.cast(tf.reduce_prod([tf.shape(x)[a] for a in axes]), tf.float32)
        sums = tf.concat([[count], tf.reshape(tf.reduce_sum(x, axes), [-1]),
                          tf.reshape(tf.reduce_sum(tf.square(x), axes), [-1])], 0)
        total = allreduce(sums, op=Sum, name=None)
        n, rest = total[0], total[1:]
        mean, square_mean = tf.split(rest / n, 2)
        shape = tf.shape(tf.reduce_mean(x, axes))
        mean_b = tf.reshape(mean, shape)
        variance = tf.reshape(square_mean, shape) - tf.square(mean_b)
        return tf.cast(mean_b, inputs.dtype), tf.cast(tf.maximum(variance, 0.0), inputs.dtype)


from hvdk8s.horovod.tensorflow import elastic  # noqa: E402  (hvd.elastic, as in Horovod; it uses the names above)
