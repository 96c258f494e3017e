"""Horovod 0.28.1's `horovod.tensorflow.keras` on Keras 3:

    import hvdk8s.horovod.tensorflow.keras as hvd    # was: import horovod.tensorflow.keras as hvd

The names of hvdk8s.horovod.tensorflow (init, rank, ..., Compression), with this module's own
`DistributedOptimizer` argument order, collectives on values, `load_model`, `callbacks` and `elastic`.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from hvdk8s.horovod.tensorflow import (  # noqa: F401  as horovod.tensorflow.keras re-exports them
    Average, Compression, ProcessSet, Sum, add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
    gloo_built, gloo_enabled, global_process_set, init, is_initialized, local_rank, local_size, mpi_built,
    mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, shutdown, size,
    start_timeline, stop_timeline)
from hvdk8s.horovod.tensorflow import allgather as _allgather, allreduce as _allreduce, \
    broadcast as _broadcast, broadcast_global_variables, keras_optimizer, reducescatter as _reducescatter
from hvdk8s.horovod.tensorflow.keras import callbacks, elastic  # noqa: F401


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='', compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A copy of the Keras 3 `optimizer` that averages (`op`: Average or Sum) the gradients over the ranks
    before using them, in `model.fit` as in `apply_gradients`: hvdk8s.horovod.tensorflow.DistributedOptimizer
    (with this module's argument order)."""
    return keras_optimizer(optimizer, device_dense, device_sparse, compression, sparse_as_dense,
                           gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
                           num_groups, groups, process_set, scale_local_gradients)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """The allreduce (default: average) of a tensor-compatible value over the ranks."""
    return _allreduce(tf.constant(value, name=name), average=average, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, op=op, compression=compression)


def allgather(value, name=None):
    """The values of every rank, concatenated along the first dimension."""
    return _allgather(tf.constant(value, name=name))


def broadcast(value, root_rank, name=None):
    """root_rank's value, on every rank."""
    return _broadcast(tf.constant(value, name=name), root_rank)


def reducescatter(value, name=None, op=Average):
    """This rank's part of the reduction of a value over the ranks."""
    return _reducescatter(tf.constant(value, name=name), op=op)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """A saved Keras 3 model (`.keras`) whose optimizer, with the state it was saved with, averages
    gradients over the ranks. `custom_optimizers`: your optimizer classes the file names."""
    if legacy_opts:
        raise ValueError("load_model(legacy_opts=True) loads tf.keras.optimizers.legacy optimizers, which Keras 3 "
                         "removed; save the model with a Keras 3 optimizer and load it without legacy_opts")
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = DistributedOptimizer(model.optimizer, compression=compression)
    return model


__all__ = ["DistributedOptimizer", "allreduce", "allgather", "broadcast", "reducescatter", "load_model",
           "broadcast_global_variables", "callbacks", "elastic", "init", "shutdown", "rank", "size", "local_rank",
           "local_size", "cross_rank", "cross_size", "Compression", "Average", "Sum"]
