"""Horovod's `horovod.tensorflow.elastic` for Keras 3: `run`, `TensorFlowKerasState`, `TensorFlowState`,
on hvdk8s.tensorflow's elastic state and runner."""
from __future__ import annotations

from typing import Any

import numpy as np


from hvdk8s import tensorflow as _htf

def run(func):
    """Decorate `func(state, ...)`: Horovod's elastic run. On a change of workers every rank starts Horovod
    again, calls the state's reset callbacks, syncs from rank 0 and calls `func` again. (Horovod's
    TensorFlow wrapper returned None for an error that was not Horovod's; here such errors propagate.)"""
    return _htf.run_elastic(func)


class TensorFlowKerasState(_htf.ElasticState):
    """Elastic state of a Keras 3 model and its optimizer (default `model.optimizer`) and any other
    attributes (`batch=0, epoch=0, ...`): saved at `commit()`, restored after a failure, synced from rank
    0 when workers join. An optimizer without slots yet is built for the model's trainable variables,
    so that its state exists on every rank to be synced."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any):
        if hasattr(model, "build") and not model.built:
            raise ValueError('Model must be built first. Run `model.build(input_shape)`.')
        self.model = model
        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        super().__init__(model, self.optimizer, **kwargs)

    def sync(self) -> None:
        super().sync()
        self._saved = [np.array(v) for v in self._variables]  # Horovod saves the synced state


class TensorFlowState(_htf.VariablesState):
    """Elastic state of a list of variables (Keras 3 or tf.Variables) and any other attributes."""

    def __init__(self, variables=None, session=None, **kwargs: Any):
        if variables is None:
            raise ValueError("TensorFlowState needs its variables: TensorFlow 2 keeps no global-variables "
                             "collection to default to (pass e.g. model.variables + optimizer.variables)")
        if session is not None:
            raise ValueError("TensorFlowState(session=...) is for TensorFlow 1 sessions, which TensorFlow 2.16+ "
                             "removed: leave it out")
        self.variables = list(variables)
        super().__init__(self.variables, **kwargs)


__all__ = ["run", "TensorFlowKerasState", "TensorFlowState"]
