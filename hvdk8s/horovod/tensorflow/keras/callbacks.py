"""Horovod's Keras callbacks (`horovod.tensorflow.keras.callbacks`) on Keras 3, with Horovod's arguments
and schedules."""
from __future__ import annotations

import keras
import tensorflow as tf

import horovod.tensorflow as _hvd
from hvdk8s import tensorflow as _htf


class BroadcastGlobalVariablesCallback(_htf.BroadcastInitialState):
    """Give every rank root_rank's model variables and optimizer state (but `local_variables`, and those
    given to `register_local_var`) when training starts; a model that Keras builds at its first batch
    (no Input), after that batch, as Horovod did. (Horovod always waited for the first batch, because
    tf.keras 2 optimizers made their state at their first step; Keras 3's can be made before.)"""

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__(root_rank)
        self.device = device
        self._local = {}
        if isinstance(local_variables, (keras.Variable, tf.Variable)):
            local_variables = [local_variables]
        for var in local_variables or ():
            self.register_local_var(var)

    def register_local_var(self, var):
        """Leave `var` as it is on each rank."""
        self._local[id(var)] = var

    def broadcast(self):
        optimizer = self.model.optimizer
        if not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        variables = [v for v in list(self.model.variables) + list(optimizer.variables) if id(v) not in self._local]
        with tf.device(self.device):
            _htf.broadcast_variables(variables, self.root_rank, "hvd.BroadcastGlobalVariablesCallback")


class MetricAverageCallback(_htf.MetricAverage):
    """At the end of each epoch, replace every logged metric by its average over the ranks (put it before
    the callbacks that read metrics: ReduceLROnPlateau, TensorBoard, ...)."""

    def __init__(self, device=''):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        with tf.device(self.device):
            super().on_epoch_end(epoch, logs)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to initial_lr * multiplier(epoch) from start_epoch to end_epoch: at each
    epoch's start (staircase) or at every batch with a fractional epoch. `multiplier`: a function of the
    epoch, or a number (then multiplier ** (epoch - start_epoch)). momentum_correction: when the rate
    changes, the momentum buffers are scaled by new/old rate (Goyal et al. 2017): Horovod scaled the
    momentum coefficient for one step, which Keras 3 compiles into the train step as a constant; scaling
    the buffers is the same update."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError('Parameter `initial_lr` is required')
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.current_epoch = None

    def _rate(self):
        lr = self.model.optimizer.learning_rate
        if not isinstance(lr, keras.Variable) and not isinstance(lr, tf.Variable):
            raise ValueError("a learning-rate callback sets the optimizer's learning rate, which is a schedule "
                             "here: give the optimizer a number")
        return lr

    def _momentum_buffers(self):
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        if not self.momentum_correction or not getattr(optimizer, "momentum", 0):
            return []
        buffers = getattr(optimizer, "momentums", None) or getattr(optimizer, "_momentums", None)
        if not buffers:
            raise ValueError(f"momentum_correction: {type(optimizer).__name__} keeps no momentum buffers that "
                             "can be scaled when the rate changes; pass momentum_correction=False")
        return buffers

    def _adjust_learning_rate(self, epoch):
        lr = self._rate()
        old, new = float(lr.numpy()), self.initial_lr * self.multiplier(epoch)
        lr.assign(new)
        if old != new:
            for buffer in self._momentum_buffers():
                buffer.assign(buffer * (new / old))

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get('steps')
            if not self.steps_per_epoch:
                raise ValueError('Could not autodetect the number of steps per epoch. Please specify the '
                                 f'steps_per_epoch parameter to the {type(self).__name__}().')

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None
                                                     and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs['lr'] = float(self._rate().numpy())


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from initial_lr / size to initial_lr over the first warmup_epochs, batch by
    batch (Goyal et al. 2017), as Horovod's callback does: `initial_lr` is the rate scaled for all ranks."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1. / self.steps_per_epoch  # round numbers at the end of each epoch
            return 1. / _hvd.size() * (epoch * (_hvd.size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and _hvd.rank() == 0:
            print(f'\nEpoch {epoch + 1}: finished gradual learning rate warmup to {float(self._rate().numpy()):g}.')


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    def __init__(self, monitor='val_loss', verbose=0, save_weights_only=False, mode='auto', save_freq='epoch'):
        raise NotImplementedError(
            "hvd.callbacks.BestModelCheckpoint left its filepath to Horovod's Spark estimator; Keras 3's "
            "ModelCheckpoint needs one when it is made: on rank 0, use keras.callbacks.ModelCheckpoint("
            "'best.keras', monitor=..., save_best_only=True)")
