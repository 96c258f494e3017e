"""PowerSGD under hvdk8s.tensorflow (Keras 3) on real Horovod ranks; writes OUT/rank<r>.json.

    powersgd_tf.py OUT

As tests/ranks/powersgd.py for PyTorch, each scenario from the same start on the same data (a step's
global batch split among the ranks), the steps traced as model.fit traces them (tf.function):
- full rank (every matrix compressed at rank min(rows, columns)) against plain averaging;
- low rank against the algorithm written out in NumPy on the whole batch in one process (M = g + e,
  P = M Q, P orthonormalized, Q = Mᵀ P, g' = P Qᵀ, e = M - g'), with its warm-up steps;
- an overflow on rank 0 only under a LossScaleOptimizer: every rank skips the step, errors and Q untouched;
- a checkpoint saved mid-run and loaded into a fresh model and optimizer continues as the run itself did.
"""
import json
import sys
from pathlib import Path

import numpy as np

import horovod.tensorflow as hvd

import hvdk8s.tensorflow as htf

htf.init()
import keras  # noqa: E402  (after init: the thread share is set before TensorFlow starts its pools)
import tensorflow as tf  # noqa: E402

out_dir = Path(sys.argv[1])
rank, size = htf.rank(), htf.size()
res = {"rank": rank, "size": size}
BATCH, LR = 16, 0.1


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)  # a conv kernel (3x3x1x8: 3 x 24 as a matrix), dense kernels, biases
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="tanh"),
                              keras.layers.Flatten(), keras.layers.Dense(24, activation="tanh"),
                              keras.layers.Dense(10)])
    return model


def batch(step: int, whole: bool = False):
    rng = np.random.default_rng(1000 + step)
    x, y = rng.standard_normal((BATCH, 8, 8, 1)).astype(np.float32), rng.integers(0, 10, BATCH)
    if whole:
        return x, y
    part = BATCH // size
    return x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def stepper(model, optimizer, poison_rank=None):
    @tf.function
    def step(x, y, poison):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
            loss = loss * tf.where(poison, float("inf"), 1.0)  # (not tf.where of two losses: 0 * inf in its gradient)
            if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                loss = optimizer.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
    return lambda s, poison=False: step(*batch(s), tf.constant(bool(poison and rank == poison_rank)))


def weights(model) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def distributed(model, compression, **powersgd):
    return htf.distribute(model, keras.optimizers.SGD(LR), compression=compression,
                          powersgd=powersgd or None if compression == "powersgd" else None)


# --- full rank = plain averaging -------------------------------------------------------------------
plain_model = make_model()
step = stepper(plain_model, distributed(plain_model, "none"))
for s in range(6):
    step(s)
psgd_model = make_model()
opt = distributed(psgd_model, "powersgd", rank=64, start_step=0, min_compression_rate=0.0)
step = stepper(psgd_model, opt)
for s in range(6):
    step(s)
res["full_rank"] = {"compressed": len(opt._hvdk8s_matrices),
                    "moved": float(np.abs(weights(psgd_model) - weights(make_model())).max()),
                    "max_abs_diff": float(np.abs(weights(psgd_model) - weights(plain_model)).max())}

# --- low rank against the algorithm written out ----------------------------------------------------
RANK, START = 1, 2
model = make_model()
opt = distributed(model, "powersgd", rank=RANK, start_step=START, min_compression_rate=0.0)
step = stepper(model, opt)
for s in range(6):
    step(s)

ref = make_model()
ws = [np.array(v.numpy()) for v in ref.trainable_variables]
state = {}  # index -> (q, e), as hvdk8s._tf_powersgd seeds them
for i, w in enumerate(ws):
    if w.ndim >= 2:
        rows, cols = w.shape[0], int(np.prod(w.shape[1:]))
        state[i] = (np.random.default_rng(i).standard_normal((cols, min(RANK, rows, cols))).astype(np.float32),
                    np.zeros((rows, cols), np.float32))
for s in range(6):
    for v, w in zip(ref.trainable_variables, ws):
        v.assign(w)
    x, y = batch(s, whole=True)
    with tf.GradientTape() as tape:
        loss = LOSS(y, ref(x, training=True))
    grads = [g.numpy() for g in tape.gradient(loss, ref.trainable_variables)]
    for i, g in enumerate(grads):
        if s >= START and i in state:
            q, e = state[i]
            m = g.reshape(e.shape) + e
            p, _ = np.linalg.qr(m @ q)
            q = m.T @ p
            approx = p @ q.T
            state[i] = (q, m - approx)
            g = approx.reshape(g.shape)
        ws[i] = ws[i] - LR * g
res["low_rank"] = {"compressed": len(opt._hvdk8s_matrices),
                   "max_abs_diff": float(max(np.abs(w - v.numpy()).max()
                                             for w, v in zip(ws, model.trainable_variables))),
                   "differs_from_plain": float(np.abs(weights(model) - weights(plain_model)).max())}

# --- an overflow on rank 0 under a LossScaleOptimizer ----------------------------------------------
model = make_model()
opt = htf.distribute(model, keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(LR)), compression="powersgd",
                     powersgd={"rank": 1, "start_step": 0, "min_compression_rate": 0.0})
step = stepper(model, opt, poison_rank=0)
step(0)
state_before = [np.array(v.numpy()) for v in opt.variables]
w_before = weights(model)
step(1, poison=True)
state_after = [np.array(v.numpy()) for v in opt.variables]
psgd_ids = opt._hvdk8s_powersgd_variables
applied = not np.array_equal(w_before, weights(model))
res["overflow"] = {
    "applied": [applied], "params_unchanged": not applied,
    "state_unchanged": all(np.array_equal(a, b) for v, a, b in zip(opt.variables, state_before, state_after)
                           if id(v) in psgd_ids and "steps" not in v.name),
    "finite_after": all(np.isfinite(a).all() for v, a in zip(opt.variables, state_after) if id(v) in psgd_ids)}
w_before = weights(model)
step(2)
res["overflow"]["applied_next"] = [not np.array_equal(w_before, weights(model))]

# --- save mid-run, resume in a fresh model and optimizer --------------------------------------------
ckpt = str(out_dir / "ckpt")  # in the test's folder (both ranks run here): none left behind in /tmp
model = make_model()
opt = distributed(model, "powersgd", rank=2, start_step=1, min_compression_rate=0.0)
step = stepper(model, opt)
for s in range(4):
    step(s)
own = [m.error.numpy().copy() for m in opt._hvdk8s_matrices.values()]
htf.save_checkpoint(ckpt, 4, model, opt)  # every rank's error becomes the mean
own_errors_differ = any(not np.array_equal(o, m.error.numpy()) for o, m in zip(own, opt._hvdk8s_matrices.values()))
for s in range(4, 8):
    step(s)
went_on = weights(model)
fresh = make_model()
opt2 = distributed(fresh, "powersgd", rank=2, start_step=1, min_compression_rate=0.0)
epoch, _ = htf.load_checkpoint(ckpt, fresh, opt2)
saved_steps = int(opt2._hvdk8s_steps.numpy())
step = stepper(fresh, opt2)
for s in range(4, 8):
    step(s)
other = make_model()  # another PowerSGD rank: other Q shapes, so the checkpoint does not fit
skipped, _ = htf.load_checkpoint(ckpt, other, distributed(other, "powersgd", rank=1, start_step=1,
                                                            min_compression_rate=0.0))
res["resume"] = {"epoch": epoch, "steps": saved_steps, "own_errors_differ_from_the_mean": own_errors_differ,
                 "max_abs_diff": float(np.abs(weights(fresh) - went_on).max()), "other_rank_loaded": skipped != 0}

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
