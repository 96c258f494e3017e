"""The tf.keras 2 spellings that Horovod's TensorFlow 2 scripts use, accepted again by Keras 3's classes
(installed once, when `hvdk8s.horovod.tensorflow` is imported; Keras 3's own spellings keep working):

- `optimizer.variables()`: Keras 3 made `variables` a property (a list); the list it returns now also
  answers a call, with a copy of itself, so `hvd.broadcast_variables(opt.variables(), 0)` runs as written.
- `optimizer.lr`: the name tf.keras 2 gave `optimizer.learning_rate` (Keras 3 dropped it).
- `model.compile(..., experimental_run_tf_function=False)`: Horovod told tf.keras 2 users to pass it so
  that fit went through the distributed optimizer; Keras 3's fit always does and has no such argument,
  so it is accepted and dropped. A model compiled with a Horovod-distributed optimizer and
  `jit_compile="auto"` (Keras 3's default, XLA on GPUs) compiles without XLA: Horovod's ops have no XLA
  kernels, and tf.keras 2's fit did not use XLA unless asked.
"""
from __future__ import annotations

import functools

import keras
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


def install(is_distributed) -> None:
    """Install the spellings (once). `is_distributed(optimizer)`: whether compile should leave XLA off."""
    if getattr(Trainer.compile, "_hvdk8s_keras2", False):
        return
    for cls in _optimizer_classes():
        prop = cls.__dict__.get("variables")
        if isinstance(prop, property):
            setattr(cls, "variables", _callable_variables(prop))
    BaseOptimizer.lr = property(lambda self: self.learning_rate,
                                lambda self, value: setattr(self, "learning_rate", value),
                                doc="tf.keras 2's name for `learning_rate`.")
    keras3_compile = Trainer.compile

    @functools.wraps(keras3_compile)
    def compile(self, *args, experimental_run_tf_function=None, **kwargs):
        optimizer = args[0] if args else kwargs.get("optimizer")
        if is_distributed(optimizer) and len(args) < 8 and kwargs.get("jit_compile", "auto") == "auto":
            kwargs["jit_compile"] = False
        return keras3_compile(self, *args, **kwargs)

    compile._hvdk8s_keras2 = True
    Trainer.compile = compile
