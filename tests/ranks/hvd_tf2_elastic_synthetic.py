"""Horovod's elastic TensorFlow 2 synthetic benchmark as its users write it (the API of Horovod's
examples/elastic/tensorflow2/tensorflow2_synthetic_benchmark_elastic.py: hvd.elastic.run,
TensorFlowKerasState with extra attributes, commits, a reset callback that rescales `opt.lr`), with only
the import naming hvdk8s. For the test: it stops once STOP exists (so the test decides, by what it saw,
when the run may end), and rank 0 writes OUT/result.json."""
import argparse
import json
import timeit
from pathlib import Path

import numpy as np
import tensorflow as tf
from hvd_tf2_parts import benchmark_arguments, benchmark_model, synthetic_batch

import hvdk8s.horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
benchmark_arguments(parser)
parser.add_argument("--stop", type=Path, required=True)
parser.add_argument("--model", default="MobileNetV3Small")  # the smallest Keras application
parser.add_argument("--num-iters", type=int, default=1000)
parser.add_argument("--num-batches-per-commit", type=int, default=1)
args = parser.parse_args()

hvd.init()
lr = 0.01
model = benchmark_model(args.model)
opt = tf.optimizers.SGD(lr * hvd.size())
data, target = synthetic_batch(args.batch_size)


@tf.function
def train_one_batch():
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))


def benchmark_step(state):
    train_one_batch()
    state.batch += 1
    if state.batch == args.num_batches_per_commit:
        state.batch = 0
        state.commit()


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


train_one_batch()


@hvd.elastic.run
def run_benchmark(state):
    if not state.warm:
        timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
        state.warm = True
        state.commit()
    for x in range(state.iter, args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        state.img_secs.append(args.batch_size * args.num_batches_per_iter / time)
        log(f"Iter #{x}: {state.img_secs[-1]:.1f} img/sec, {hvd.size()} ranks, lr {float(opt.lr):g}")
        state.iter = x
        state.commit()
        if args.stop.exists():
            break


resets = []


def on_state_reset():
    opt.lr.assign(lr * hvd.size())
    resets.append(hvd.size())


state = hvd.elastic.TensorFlowKerasState(model, opt, img_secs=[], iter=0, batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * np.mean(state.img_secs):.1f}")
if hvd.rank() == 0:
    (args.out / "result.json").write_text(json.dumps({"size": hvd.size(), "resets": resets, "iter": state.iter,
                                                      "lr": float(opt.lr), "iterations": int(opt.iterations)}))
