"""The tf.keras 2 spellings that Horovod's TensorFlow 2 scripts use, accepted again by Keras 3's classes
(installed once, when `hvdk8s.horovod.tensorflow` is imported; Keras 3's own spellings keep working):

- `optimizer.variables()`: Keras 3 made `variables` a property (a list); the list it returns now also
  answers a call, with a copy of itself, so `hvd.broadcast_variables(opt.variables(), 0)` runs as written.
- `optimizer.lr`: the name tf.keras 2 gave `optimizer.learning_rate` (Keras 3 dropped it).
- `tf.keras.backend.set_value(optimizer.lr, value)` (Horovod's elastic Keras example resets the rate so):
  Keras 3's legacy set_value reads `x.dtype.name`, and a Keras 3 variable's dtype is a string.
- `model.compile(..., experimental_run_tf_function=False)`: Horovod told tf.keras 2 users to pass it so
  that fit went through the distributed optimizer; Keras 3's fit always does and has no such argument,
  so it is accepted and dropped. A model compiled with a Horovod-distributed optimizer and
  `jit_compile="auto"` (Keras 3's default, XLA on GPUs) compiles without XLA: Horovod's ops have no XLA
  kernels, and tf.keras 2's fit did not use XLA unless asked. Under the mixed_float16 policy, Keras 3's
  compile wraps the optimizer in a LossScaleOptimizer; around a distributed one it gets one that
  reduces before its overflow check (`loss_scaled`; the optimizer given to compile stays the one that
  holds the state), as tf.keras 2 did under Horovod: Keras's own would check each rank's gradients
  first, and a rank that overflowed alone would skip the allreduce the others wait in.
"""
from __future__ import annotations

import functools
import sys

import keras
import numpy as np
from keras.src import backend as _backend
from keras.src.legacy import backend as _legacy_backend
from keras.src.optimizers.base_optimizer import BaseOptimizer
from keras.src.trainers.trainer import Trainer


class CallableList(list):
    """A list that, called, returns a copy of itself: tf.keras 2's `optimizer.variables()`."""

    def __call__(self) -> list:
        return list(self)


def _callable_variables(prop: property) -> property:
    return property(lambda self: CallableList(prop.fget(self)), doc=prop.__doc__)


def _optimizer_classes() -> list:
    found, todo = [], [BaseOptimizer]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _set_value(x, value) -> None:
    """tf.keras 2's `backend.set_value`, for Keras 3 variables (dtype a string) as for tf.Variables."""
    x.assign(np.asarray(value, dtype=_backend.standardize_dtype(x.dtype)))


def install(is_distributed, loss_scaled) -> None:
    """Install the spellings (once). `is_distributed(optimizer)`: whether compile should leave XLA off;
    `loss_scaled(optimizer)`: the LossScaleOptimizer compile wraps it in under mixed_float16."""
    if getattr(Trainer.compile, "_hvdk8s_keras2", False):
        return
    for cls in _optimizer_classes():
        prop = cls.__dict__.get("variables")
        if isinstance(prop, property):
            setattr(cls, "variables", _callable_variables(prop))
    BaseOptimizer.lr = property(lambda self: self.learning_rate,
                                lambda self, value: setattr(self, "learning_rate", value),
                                doc="tf.keras 2's name for `learning_rate`.")
    # tf.keras.backend (keras._tf_keras.keras.backend) takes set_value from the legacy module when it is
    # first imported: patched there, and in it if it already was
    for module in (_legacy_backend, sys.modules.get("keras._tf_keras.keras.backend")):
        if module is not None:
            module.set_value = _set_value
    keras3_compile = Trainer.compile

    @functools.wraps(keras3_compile)
    def compile(self, *args, experimental_run_tf_function=None, **kwargs):
        optimizer = args[0] if args else kwargs.get("optimizer")
        if not is_distributed(optimizer):
            return keras3_compile(self, *args, **kwargs)
        if len(args) < 8 and kwargs.get("jit_compile", "auto") == "auto":
            kwargs["jit_compile"] = False
        scale_loss = args[8] if len(args) > 8 else kwargs.get("auto_scale_loss", True)
        if (scale_loss and self.dtype_policy.name == "mixed_float16"
                and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
            optimizer = loss_scaled(optimizer)
            args, kwargs = ((optimizer, *args[1:]), kwargs) if args else (args, {**kwargs, "optimizer": optimizer})
        return keras3_compile(self, *args, **kwargs)

    compile._hvdk8s_keras2 = True
    Trainer.compile = compile
