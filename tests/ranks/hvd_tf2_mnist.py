"""Horovod's TensorFlow 2 GradientTape MNIST training as its users write it (the API of Horovod's
examples/tensorflow2/tensorflow2_mnist.py), with only the import naming hvdk8s; the MNIST-shaped data
comes from DATA (an .npz of x_train, y_train the test writes). Writes OUT/rank<r>.json."""
import argparse
import json
from pathlib import Path

import tensorflow as tf
from hvd_tf2_parts import build_mnist_model, digest, mnist_dataset

import hvdk8s.horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("data", type=Path)
parser.add_argument("out", type=Path)
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

dataset = mnist_dataset(args.data, seed=hvd.rank())
mnist_model = build_mnist_model()
loss = tf.losses.SparseCategoricalCrossentropy()
opt = tf.optimizers.Adam(0.001 * hvd.size())
checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss_value


losses = []
for batch, (images, labels) in enumerate(dataset.take(args.steps // hvd.size())):
    losses.append(float(training_step(images, labels, batch == 0)))
    if batch % 10 == 0 and hvd.rank() == 0:
        print(f"Step #{batch}\tLoss: {losses[-1]:.6f}", flush=True)
if hvd.rank() == 0:
    checkpoint.save(str(args.out / "checkpoints" / "ckpt"))

(args.out / f"rank{hvd.rank()}.json").write_text(json.dumps(
    {"size": hvd.size(), "first_losses": losses[:3], "last_losses": losses[-3:], "weights": digest(v.numpy() for v in mnist_model.variables)}))
