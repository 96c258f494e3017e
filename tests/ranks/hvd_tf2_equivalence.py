"""hvdk8s.horovod.tensorflow on 2 real ranks against one process on the whole batch: each rank takes
half of every batch, and the result must be the one process's, to float rounding (to fp16's rounding
with fp16 compression). Covers DistributedGradientTape and DistributedOptimizer (apply_gradients and
model.fit) with and without fp16 compression, gradient_predivide_factor, op=Sum, sparse gradients,
backward_passes_per_step, local sources, broadcast_variables, SyncBatchNormalization and the keras
module's value collectives. Writes OUT/rank<r>.json."""
import json
import re
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import hvdk8s.horovod.tensorflow as hvd
import hvdk8s.tensorflow
import hvdk8s.horovod.tensorflow.keras as hvdk

out_dir = Path(sys.argv[1])
hvd.init()
rank, size = hvd.rank(), hvd.size()
rng = np.random.default_rng(7)
X = rng.standard_normal((4, 32, 12)).astype("float32")
Y = rng.integers(0, 5, (4, 32))
half = 32 // size
mine = slice(rank * half, (rank + 1) * half)
xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
res = {"rank": rank, "size": size}


def twins(embedding=False):
    """A model and its reference with the same weights (the same on both ranks)."""
    keras.utils.set_random_seed(3)
    if embedding:
        layers = [keras.Input((4,), dtype="int32"), keras.layers.Embedding(50, 6), keras.layers.Flatten(),
                  keras.layers.Dense(5)]
    else:
        layers = [keras.Input((12,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(5)]
    m = keras.Sequential(layers)
    r = keras.models.clone_model(m)
    r.set_weights(m.get_weights())
    return m, r


def grads(model, x, y):
    with tf.GradientTape() as tape:
        loss = xent(y, model(x, training=True))
    return tape.gradient(loss, model.trainable_variables)


def diff(model, ref):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(model.trainable_variables, ref.trainable_variables))


def fp16_bound(lr, steps_grads):
    """What fp16 rounding of each rank's gradient can move a weight by: lr x 2^-11 relative, summed over
    the ranks' gradients and steps (SGD without momentum)."""
    return lr * 2.0 ** -10 * max(float(np.max(np.abs(np.asarray(g)))) for gs in steps_grads for g in gs) * len(steps_grads)


def tape_run(compression, steps=3, **options):
    model, ref = twins()
    opt, ropt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    seen = []

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = xent(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression, **options)
        g = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(g, model.trainable_variables))

    for s in range(steps):
        step(X[s][mine], Y[s][mine])
        full = grads(ref, X[s], Y[s])
        seen.append(full)
        ropt.apply_gradients(zip(full, ref.trainable_variables))
    return {"max_abs_diff": diff(model, ref), "fp16_bound": fp16_bound(0.1, seen)}


eq = res["tape"] = {"fp32": tape_run(hvd.Compression.none), "fp16": tape_run(hvd.Compression.fp16),
                    "predivide": tape_run(hvd.Compression.none, gradient_predivide_factor=2.0)}

# op=Sum: the sum of the ranks' gradients, i.e. size x the whole batch's mean gradient.
model, ref = twins()
with tf.GradientTape() as tape:
    loss = xent(Y[0][mine], model(X[0][mine]))
summed = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, model.trainable_variables)
eq["sum"] = {"max_abs_diff": max(float(np.max(np.abs(np.asarray(a) - size * np.asarray(b))))
                                 for a, b in zip(summed, grads(ref, X[0], Y[0])))}

# Sparse gradients (an embedding): kept sparse (allgathered) or made dense, the same update.
ids = rng.integers(0, 50, (32, 4)).astype("int32")
for dense in (False, True):
    model, ref = twins(embedding=True)
    opt, ropt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        loss = xent(Y[0][mine], model(ids[mine]))
    g = hvd.DistributedGradientTape(tape, sparse_as_dense=dense).gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(g, model.trainable_variables))
    ropt.apply_gradients(zip(grads(ref, ids, Y[0]), ref.trainable_variables))
    eq["sparse_as_dense" if dense else "sparse"] = {"max_abs_diff": diff(model, ref),
                                                     "kind": type(g[0]).__name__}

# A local source (PartialDistributedGradientTape): its gradient stays this rank's, divided by size.
model, ref = twins()
with tf.GradientTape() as tape:
    loss = xent(Y[0][mine], model(X[0][mine]))
g = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[-1]).gradient(loss, model.trainable_variables)
own = grads(ref, X[0][mine], Y[0][mine])
eq["local_layer"] = {"max_abs_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b) / size)))
                                         for a, b in zip(g[2:], own[2:]))}


def optimizer_run(compression, steps=3, **options):
    model, ref = twins()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression=compression, **options)
    ropt = keras.optimizers.SGD(0.1, momentum=0.9)
    seen = []
    for s in range(steps):
        opt.apply_gradients(zip(grads(model, X[s][mine], Y[s][mine]), model.trainable_variables))
        full = grads(ref, X[s], Y[s])
        seen.append(full)
        ropt.apply_gradients(zip(full, ref.trainable_variables))
    return {"max_abs_diff": diff(model, ref), "fp16_bound": 10 * fp16_bound(0.1, seen)}  # x10: momentum 0.9


eq = res["optimizer"] = {"fp32": optimizer_run(hvd.Compression.none), "fp16": optimizer_run(hvd.Compression.fp16)}

# register_local_var: that variable's gradient stays this rank's own (divided by size), the rest averaged.
model, ref = twins()
opt, ropt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), keras.optimizers.SGD(0.1)
opt.register_local_var(model.trainable_variables[2])  # the last layer's kernel
opt.apply_gradients(zip(grads(model, X[0][mine], Y[0][mine]), model.trainable_variables))
whole, own = grads(ref, X[0], Y[0]), grads(ref, X[0][mine], Y[0][mine])
ropt.apply_gradients(zip([o / size if i == 2 else w for i, (w, o) in enumerate(zip(whole, own))],
                         ref.trainable_variables))
eq["local_var"] = {"max_abs_diff": diff(model, ref), "variables": [len(opt.variables), len(ropt.variables)]}


def accumulated(average, make=lambda: keras.optimizers.SGD(0.1)):
    """backward_passes_per_step=2: two micro-batches per update, their gradients summed (Horovod's
    default) or averaged (average_aggregated_gradients=True). `iterations` counts micro-batches as
    Horovod's does: the reference's count is set to what Horovod's would be at each update (Adam's bias
    correction reads it)."""
    model, ref = twins()
    opt = hvd.DistributedOptimizer(make(), backward_passes_per_step=2, average_aggregated_gradients=average)
    ropt = make()
    for s in (0, 2):
        for m in (s, s + 1):
            opt.apply_gradients(zip(grads(model, X[m][mine], Y[m][mine]), model.trainable_variables))
        pair = [grads(ref, X[m], Y[m]) for m in (s, s + 1)]
        ropt.iterations.assign(s + 1)  # Horovod: the update after micro-batches s and s + 1
        ropt.apply_gradients(zip([(a + b) / (2 if average else 1) for a, b in zip(*pair)], ref.trainable_variables))
    return {"max_abs_diff": diff(model, ref), "iterations": int(opt.iterations)}


eq["accumulated_sum"], eq["accumulated_mean"] = accumulated(False), accumulated(True)
eq["accumulated_adam"] = accumulated(False, lambda: keras.optimizers.Adam(0.01))

# model.fit with the keras module's DistributedOptimizer and callbacks: 2 epochs of 2 batches.
for compression in ("none", "fp16"):
    model, ref = twins()
    if rank == 1:  # a different start: the callback must give rank 1 rank 0's weights before the first step
        model.set_weights([w + 1.0 for w in model.get_weights()])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                      compression=getattr(hvdk.Compression, compression)),
                  loss=xent, experimental_run_tf_function=False)
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=xent)
    x, y = X[:2].reshape(-1, 12), Y[:2].reshape(-1)
    idx = np.concatenate([np.arange(b * 32 + rank * half, b * 32 + (rank + 1) * half) for b in range(2)])
    hist = model.fit(x[idx], y[idx], batch_size=half, epochs=2, shuffle=False, verbose=0,
                     callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvdk.callbacks.MetricAverageCallback()])
    rhist = ref.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    eq[f"fit_{compression}"] = {"max_abs_diff": diff(model, ref), "loss": hist.history["loss"],
                                "ref_loss": rhist.history["loss"], "jit_compile": bool(model.jit_compile)}

# model.fit under the mixed_float16 policy (Horovod's elastic Keras example's --use-mixed-precision): compile
# wraps the distributed optimizer in a LossScaleOptimizer that reduces before its overflow check. Rank 0's
# second batch overflows float16 and rank 1's does not: both must skip that step (halving the scale) and
# go on in step; with the check before the reduction, rank 0 would skip the allreduce rank 1 waits in.
keras.mixed_precision.set_global_policy("mixed_float16")
try:
    model, _ = twins()
    dist = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=dist, loss=xent, experimental_run_tf_function=False)
    x, y = X[:2].reshape(-1, 12).copy(), Y[:2].reshape(-1)
    idx = np.concatenate([np.arange(b * 32 + rank * half, b * 32 + (rank + 1) * half) for b in range(2)])
    x = x[idx]
    if rank == 0:
        x[half:] *= 1e6  # past float16's 65504 in the first layer
    model.fit(x, y[idx], batch_size=half, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    eq["fit_mixed_float16"] = {
        "inner_is_yours": model.optimizer.inner_optimizer is dist, "scale": float(model.optimizer.dynamic_scale),
        "iterations": int(dist.iterations), "weights": [np.asarray(v).tolist() for v in model.trainable_variables]}
finally:
    keras.mixed_precision.set_global_policy("float32")

# broadcast_variables of model.variables and of optimizer.variables / optimizer.variables().
model, _ = twins()
opt = keras.optimizers.Adam(0.01)
opt.apply_gradients(zip(grads(model, X[rank], Y[rank]), model.trainable_variables))  # ranks now differ
before = [np.asarray(v).copy() for v in model.variables + opt.variables]
hvd.broadcast_variables(model.variables, root_rank=0)
hvd.broadcast_variables(opt.variables(), root_rank=0)
after = [np.asarray(v) for v in model.variables + opt.variables]
res["broadcast"] = {"before": [float(np.sum(a)) for a in before], "after": [float(np.sum(a)) for a in after]}

# SyncBatchNormalization: training statistics of the whole batch.
keras.utils.set_random_seed(5)
sync, plain = hvd.SyncBatchNormalization(momentum=0.5), keras.layers.BatchNormalization(momentum=0.5)
x = (rng.standard_normal((32, 6)) * 3 + 1).astype("float32")
y_sync = np.asarray(sync(x[mine], training=True))
y_plain = np.asarray(plain(x, training=True))[mine]
res["sync_bn"] = {"output_diff": float(np.max(np.abs(y_sync - y_plain))),
                  "moving_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                     for a, b in zip(sync.non_trainable_variables, plain.non_trainable_variables))}

# The keras module's collectives on values.
res["values"] = {"allreduce": np.asarray(hvdk.allreduce([1.0 + rank, 2.0])).tolist(),
                 "allgather": np.asarray(hvdk.allgather([rank])).tolist(),
                 "broadcast": float(hvdk.broadcast(10.0 + rank, root_rank=1))}

# load_model: a model saved with a distributed optimizer loads anywhere; hvd.load_model distributes its
# optimizer again, with the state it was saved with.
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(5)])
model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=xent)
model.fit(X[0][mine], Y[0][mine], batch_size=half, verbose=0)
saved = out_dir / f"model{rank}.keras"
model.save(saved)
plain, loaded = keras.models.load_model(saved), hvdk.load_model(saved)
loaded.fit(X[1][mine], Y[1][mine], batch_size=half, verbose=0)
res["load_model"] = {"plain": type(plain.optimizer).__name__, "loaded": type(loaded.optimizer).__name__,
                     "distributed": isinstance(loaded.optimizer, hvdk8s.tensorflow._Distributed),
                     "iterations": int(loaded.optimizer.iterations)}



def autograph_converted(run) -> list[str]:
    """The functions autograph converted while `run` traced (it loads each as a module of its own)."""
    def generated():
        return {name for name in sys.modules if name.startswith("__autograph_generated_file")}
    before = generated()
    run()
    return sorted(f for name in generated() - before
                  for f in re.findall(r"def tf__(\w+)", Path(sys.modules[name].__file__).read_text()))


# A user's tf.function calling Horovod's API and a distributed optimizer: autograph converts the user's
# function only; hvdk8s's and Horovod's code below it runs as written, as under model.fit.
model = twins()[0]
dist = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))


@tf.function
def user_step(x, y):
    with tf.GradientTape() as tape:
        loss = xent(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape)
    dist.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)


res["autograph_converted"] = autograph_converted(lambda: user_step(X[0][mine], Y[0][mine]))
(out_dir / f"rank{rank}.json").write_text(json.dumps(res))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
