"""Horovod's TensorFlow 2 Keras MNIST training as its users write it (the API of Horovod's
examples/tensorflow2/tensorflow2_keras_mnist.py: DistributedOptimizer, compile with
experimental_run_tf_function=False, the broadcast, metric-average and warm-up callbacks, a checkpoint
on rank 0), with only the import naming hvdk8s; the data comes from DATA (an .npz the test writes).
Writes OUT/rank<r>.json."""
import argparse
import json
import os
from pathlib import Path

import tensorflow as tf
from hvd_tf2_parts import build_mnist_model, digest, mnist_dataset

import hvdk8s.horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("data", type=Path)
parser.add_argument("out", type=Path)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

dataset = mnist_dataset(args.data, seed=hvd.rank())
mnist_model = build_mnist_model()
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                    experimental_run_tf_function=False)
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
]
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.out, "checkpoint-{epoch}.h5")))
verbose = 1 if hvd.rank() == 0 else 0
history = mnist_model.fit(dataset, steps_per_epoch=args.steps // hvd.size(), callbacks=callbacks, epochs=args.epochs,
                          verbose=verbose)

(args.out / f"rank{hvd.rank()}.json").write_text(json.dumps({
    "size": hvd.size(), "history": {k: [float(x) for x in v] for k, v in history.history.items()},
    "jit_compile": bool(mnist_model.jit_compile), "weights": digest(v.numpy() for v in mnist_model.variables)}))
