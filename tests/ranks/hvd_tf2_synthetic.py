"""A Horovod TensorFlow 2 synthetic benchmark as its users write it (the API of Horovod's
examples/tensorflow2/tensorflow2_synthetic_benchmark.py: DistributedGradientTape in a tf.function,
broadcast_variables of model.variables and opt.variables() after the first step), with only the import
naming hvdk8s. A small Keras application on small images, a few steps; writes OUT/rank<r>.json."""
import argparse
import json
import timeit

import numpy as np
import tensorflow as tf
from hvd_tf2_parts import benchmark_arguments, benchmark_model, digest, synthetic_batch

import hvdk8s.horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
benchmark_arguments(parser)
parser.add_argument("--model", default="MobileNetV3Small")  # the smallest Keras application
parser.add_argument("--num-iters", type=int, default=3)
args = parser.parse_args()

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

model = benchmark_model(args.model)
opt = tf.optimizers.SGD(0.01)
data, target = synthetic_batch(args.batch_size)
initial = [v.numpy() for v in model.trainable_variables]


@tf.function
def benchmark_step(first_batch):
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:  # after the first step, when the optimizer has its state
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log(f"Model: {args.model}, batch size {args.batch_size}, {hvd.size()} ranks")
benchmark_step(first_batch=True)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / time)
    log(f"Iter #{x}: {img_secs[-1]:.1f} img/sec per CPU")
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * np.mean(img_secs):.1f}")


(args.out / f"rank{hvd.rank()}.json").write_text(json.dumps({
    "size": hvd.size(), "initial": digest(initial), "final": digest(v.numpy() for v in model.trainable_variables),
    "optimizer": digest(v.numpy() for v in opt.variables), "iterations": int(opt.iterations.numpy())}))
