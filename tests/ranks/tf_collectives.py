"""Runs on 2 real Horovod ranks with TensorFlow/Keras 3; writes OUT/rank<r>.json for the test to check.

Covers: broadcast of variables and optimizer state, data-parallel equivalence through a custom
GradientTape loop (fp32 and fp16) and through model.fit, and the rank-sharded tf.data pipeline."""
import json
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import hvdk8s.tensorflow as htf
from hvdk8s.data.datasets import ArrayDataset
from hvdk8s.data.tensorflow import sharded_dataset
from hvdk8s.models import build
from hvdk8s.train import parameter_digest
from hvdk8s.train_tf import weights_digest

out_dir = Path(sys.argv[1])
htf.init()
rank, size = htf.rank(), htf.size()
res = {"rank": rank, "size": size, "threads": tf.config.threading.get_intra_op_parallelism_threads()}
res["allreduce_average"] = htf.allreduce([1.0 + rank, 10.0 * rank]).tolist()

# --- broadcast: ranks initialise differently, then all hold rank 0's variables and optimizer state ---
keras.utils.set_random_seed(100 + rank)
model = build("cnn", "tensorflow", {"channels": [8]}, input_shape=[1, 8, 8], num_classes=10)
opt = htf.distribute(keras.optimizers.Adam(1e-2))
if rank == 0:  # rank 0 alone has taken a step (as after a resume)
    opt.build(model.trainable_variables)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
            np.array([1, 2]), model(np.random.rand(2, 1, 8, 8).astype("float32")))
    keras.optimizers.Adam.apply(opt, tape.gradient(loss, model.trainable_variables))  # local step, no allreduce
res["before_broadcast"] = weights_digest(model)
res["rank0_opt_before"] = parameter_digest({str(i): np.asarray(v) for i, v in enumerate(opt.variables)}) \
    if opt.built else None
htf.broadcast_state(model, opt)
res["after_broadcast"] = weights_digest(model)
res["opt_after"] = parameter_digest({str(i): np.asarray(v) for i, v in enumerate(opt.variables)})

# --- data-parallel equivalence ---------------------------------------------------------------------
rng = np.random.default_rng(1)
images = rng.standard_normal((3, 64, 1, 8, 8)).astype("float32")
labels = rng.integers(0, 10, (3, 64))
xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
half = 64 // size


def twins():
    keras.utils.set_random_seed(0)
    m = build("mlp", "tensorflow", {"hidden": [32, 32]}, input_shape=[1, 8, 8], num_classes=10)
    r = keras.models.clone_model(m)
    r.set_weights(m.get_weights())
    return m, r


def grads_of(model, x, y):
    with tf.GradientTape() as tape:
        loss = xent(y, model(x, training=True))
    return tape.gradient(loss, model.trainable_variables)


def compare(model, ref, half_grads, lr):
    worst, ratio = 0.0, 0.0
    for p, q, *gs in zip(model.trainable_variables, ref.trainable_variables, *half_grads):
        diff = np.abs(np.asarray(p) - np.asarray(q))
        bound = lr * 2.0 ** -9 * sum(np.abs(np.asarray(g)) for g in gs) + 1e-6
        worst, ratio = max(worst, float(diff.max())), max(ratio, float((diff / bound).max()))
    return {"max_abs_diff": worst, "max_diff_over_fp16_bound": ratio}


def tape_equivalence(compression, steps):
    model, ref = twins()
    lr = 0.1
    dopt = htf.distribute(keras.optimizers.SGD(lr, momentum=0.9), compression=compression)
    ropt = keras.optimizers.SGD(lr, momentum=0.9)
    for s in range(steps):
        x, y = images[s], labels[s]
        halves = [grads_of(ref, x[r * half:(r + 1) * half], y[r * half:(r + 1) * half]) for r in range(size)]
        dopt.apply(grads_of(model, x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]),
                   model.trainable_variables)
        ropt.apply(grads_of(ref, x, y), ref.trainable_variables)
    return compare(model, ref, halves, lr)


def fit_equivalence():
    model, ref = twins()
    model.compile(optimizer=htf.distribute(keras.optimizers.SGD(0.1, momentum=0.9)), loss=xent, jit_compile=False)
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=xent, jit_compile=False)
    x, y = images.reshape(-1, 1, 8, 8)[:128], labels.reshape(-1)[:128]  # 2 global steps of 64
    mine = np.concatenate([np.arange(s * 64 + rank * half, s * 64 + (rank + 1) * half) for s in range(2)])
    model.fit(x[mine], y[mine], batch_size=half, epochs=1, shuffle=False, verbose=0, callbacks=htf.callbacks())
    ref.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    return compare(model, ref, [], 0.1)


res["equivalence"] = {"tape_fp32": tape_equivalence("none", 3), "tape_fp16": tape_equivalence("fp16", 1),
                      "fit_fp32": fit_equivalence()}

# --- sharded tf.data: every sample once per epoch, same number of steps on every rank -------------
ds = ArrayDataset(np.arange(103, dtype=np.float32)[:, None], np.arange(103))
data = sharded_dataset(ds, 7, rank=rank, size=size, seed=5, weights=True)
res["shards"] = {}
for epoch in ("1", "2"):
    ids, steps, weight_sum = [], 0, 0.0
    for x, y, w in data:
        ids += [int(i) for i, wi in zip(y.numpy(), w.numpy()) if wi > 0]
        weight_sum += float(np.sum(w))
        steps += 1
    res["shards"][epoch] = {"ids": ids, "steps": steps, "weight_sum": weight_sum}

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))
