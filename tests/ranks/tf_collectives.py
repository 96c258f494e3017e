"""Runs on 2 real Horovod ranks with TensorFlow/Keras 3; writes OUT/rank<r>.json for the test to check.

Covers: broadcast of variables and optimizer state (by distribute and by broadcast_state),
data-parallel equivalence with one process on the whole batch (GradientTape loop in fp32, with fp16
compression, with global_clipnorm; model.fit), mixed precision (fp16 with LossScaleOptimizer, bf16),
checkpoints with `extra` and a foreign checkpoint skipped, and the rank-sharded tf.data pipeline."""
import hashlib
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

out_dir = Path(sys.argv[1])
htf.init()
rank, size = htf.rank(), htf.size()
res = {"rank": rank, "size": size, "threads": tf.config.threading.get_intra_op_parallelism_threads()}
res["allreduce_average"] = htf.allreduce([1.0 + rank, 10.0 * rank]).tolist()


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()[:16]


def weights(model) -> str:
    return digest(model.get_weights())


# --- broadcast: ranks initialise differently, then all hold rank 0's variables and optimizer state ---
keras.utils.set_random_seed(100 + rank)
model = build("cnn", "tensorflow", {"channels": [8]}, input_shape=[1, 8, 8], num_classes=10)
res["before_distribute"] = weights(model)
opt = htf.distribute(model, keras.optimizers.Adam(1e-2))  # a built model: broadcast at once
res["after_distribute"] = weights(model)
if rank == 0:  # rank 0 alone takes a step (as after a resume)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
            np.array([1, 2]), model(np.random.rand(2, 1, 8, 8).astype("float32")))
    keras.optimizers.Adam.apply(opt, tape.gradient(loss, model.trainable_variables))  # local step, no allreduce
res["before_broadcast"] = weights(model)
res["rank0_opt_before"] = digest(opt.variables)
htf.broadcast_state(model, opt)
res["after_broadcast"] = weights(model)
res["opt_after"] = digest(opt.variables)

# --- data-parallel equivalence ---------------------------------------------------------------------
rng = np.random.default_rng(1)
images = rng.standard_normal((3, 64, 1, 8, 8)).astype("float32")
labels = rng.integers(0, 10, (3, 64))
xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
half = 64 // size
mine = slice(rank * half, (rank + 1) * half)
LR, CLIP = 0.1, 0.5


def twins():
    keras.utils.set_random_seed(0)
    m = build("mlp", "tensorflow", {"hidden": [32, 32]}, input_shape=[1, 8, 8], num_classes=10)
    r = keras.models.clone_model(m)
    r.set_weights(m.get_weights())
    return m, r


def grads_of(model, x, y, opt=None):
    with tf.GradientTape() as tape:
        loss = xent(y, model(x, training=True))
        if opt is not None:  # a LossScaleOptimizer: gradients of the scaled loss
            loss = opt.scale_loss(loss)
    return tape.gradient(loss, model.trainable_variables)


def global_norm(grads) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in grads)))


def compare(model, ref, half_grads, lr):
    worst, ratio = 0.0, 0.0
    for p, q, *gs in zip(model.trainable_variables, ref.trainable_variables, *half_grads):
        diff = np.abs(np.asarray(p) - np.asarray(q))
        bound = lr * 2.0 ** -9 * sum(np.abs(np.asarray(g)) for g in gs) + 1e-6
        worst, ratio = max(worst, float(diff.max())), max(ratio, float((diff / bound).max()))
    return {"max_abs_diff": worst, "max_diff_over_fp16_bound": ratio}


def tape_equivalence(compression, steps, **clip):
    model, ref = twins()
    dopt = htf.distribute(model, keras.optimizers.SGD(LR, momentum=0.9, **clip), compression=compression)
    ropt = keras.optimizers.SGD(LR, momentum=0.9, **clip)
    norms = []
    for s in range(steps):
        x, y = images[s], labels[s]
        halves = [grads_of(ref, x[r * half:(r + 1) * half], y[r * half:(r + 1) * half]) for r in range(size)]
        dopt.apply(grads_of(model, x[mine], y[mine]), model.trainable_variables)
        full = grads_of(ref, x, y)
        norms.append(global_norm(full))
        ropt.apply(full, ref.trainable_variables)
    return {**compare(model, ref, halves, LR), "unclipped_norms": norms}, ref


def clip_sensitivity():
    """How far the first update moves if each rank clipped its own gradients before averaging: what the
    clipped equivalence would see if clipping acted on local gradients."""
    _, ref = twins()
    halves = [grads_of(ref, images[0][r * half:(r + 1) * half], labels[0][r * half:(r + 1) * half])
              for r in range(size)]
    avg = [sum(gs) / size for gs in zip(*halves)]
    after = tf.clip_by_global_norm(avg, CLIP)[0]
    before = [sum(gs) / size for gs in zip(*[tf.clip_by_global_norm(h, CLIP)[0] for h in halves])]
    return LR * max(float(np.max(np.abs(a - b))) for a, b in zip(after, before))


def fit_equivalence(passes=1):
    """2 updates of 64 samples, in `passes` micro-batches each (accumulated by both models)."""
    model, ref = twins()
    model.compile(optimizer=htf.distribute(model, keras.optimizers.SGD(LR, momentum=0.9),
                                           backward_passes_per_step=passes), loss=xent, jit_compile=False)
    ref.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9, gradient_accumulation_steps=passes if passes > 1
                                               else None), loss=xent, jit_compile=False)
    micro = 64 // passes
    part = micro // size
    x, y = images.reshape(-1, 1, 8, 8)[:128], labels.reshape(-1)[:128]
    idx = np.concatenate([np.arange(s * micro + rank * part, s * micro + (rank + 1) * part)
                          for s in range(128 // micro)])
    model.fit(x[idx], y[idx], batch_size=part, epochs=1, shuffle=False, verbose=0, callbacks=htf.callbacks())
    ref.fit(x, y, batch_size=micro, epochs=1, shuffle=False, verbose=0)
    return {**compare(model, ref, [], LR), "updates": int(model.optimizer.iterations)}


eq = res["equivalence"] = {"tape_fp32": tape_equivalence("none", 3)[0], "tape_fp16": tape_equivalence("fp16", 1)[0],
                           "fit_fp32": fit_equivalence(), "fit_accumulated": fit_equivalence(passes=2)}
eq["tape_clipped"], clipped_ref = tape_equivalence("none", 3, global_clipnorm=CLIP)
eq["tape_clipped"].update(clipnorm=CLIP, clip_before_average_diff=clip_sensitivity())


# --- mixed precision -------------------------------------------------------------------------------
fp32_init = twins()[0].get_weights()


def fp16_run():
    """fp16 policy + LossScaleOptimizer (clipping on the inner optimizer), the same 3 steps as the
    clipped fp32 reference; then a step whose gradients overflow on rank 1 only."""
    htf.set_precision("fp16")
    model, _ = twins()
    out = {"same_init_as_fp32": digest(model.get_weights()) == digest(fp32_init),
           "compute_dtype": model.layers[-1].compute_dtype, "variable_dtype": model.layers[-1].kernel.dtype}
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(LR, momentum=0.9, global_clipnorm=CLIP))
    dopt = htf.distribute(model, lso)
    out["inner_distributed"] = type(dopt.inner_optimizer) is keras.optimizers.SGD
    for s in range(3):
        dopt.apply(grads_of(model, images[s][mine], labels[s][mine], dopt), model.trainable_variables)
    params = [np.asarray(v) for v in model.trainable_variables]
    ref = [np.asarray(v) for v in clipped_ref.trainable_variables]
    out.update(scale=float(dopt.dynamic_scale), finite=all(bool(np.isfinite(p).all()) for p in params),
               digest=digest(params), iterations=int(dopt.iterations),
               max_abs_diff_vs_fp32=max(float(np.max(np.abs(p - q))) for p, q in zip(params, ref)),
               max_update_fp32=max(float(np.max(np.abs(q - p0))) for q, p0 in zip(ref, fp32_init)))
    grads = grads_of(model, images[0][mine], labels[0][mine], dopt)
    if rank == 1:
        grads = [grads[0] + np.float32(np.inf)] + list(grads[1:])
    dopt.apply(grads, model.trainable_variables)
    out["overflow_step"] = {
        "params_unchanged": all(np.array_equal(p, np.asarray(v)) for p, v in zip(params, model.trainable_variables)),
        "scale": float(dopt.dynamic_scale), "iterations": int(dopt.iterations)}

    fit_model, _ = twins()  # model.fit scales the loss itself
    fit_model.compile(optimizer=htf.distribute(fit_model, keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(LR, momentum=0.9))), loss=xent, jit_compile=False)
    hist = fit_model.fit(images[0][mine], labels[0][mine], batch_size=half // 2, epochs=1, shuffle=False, verbose=0,
                         callbacks=htf.callbacks())
    out["fit"] = {"loss": float(hist.history["loss"][-1]), "digest": weights(fit_model),
                  "finite": all(bool(np.isfinite(w).all()) for w in fit_model.get_weights())}
    htf.set_precision("fp32")
    return out


def bf16_run():
    htf.set_precision("bf16")
    model, _ = twins()
    before = model.get_weights()
    dopt = htf.distribute(model, keras.optimizers.SGD(LR))
    with tf.GradientTape() as tape:
        loss = xent(labels[0][mine], model(images[0][mine], training=True))
    dopt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    out = {"compute_dtype": model.layers[-1].compute_dtype, "variable_dtype": model.layers[-1].kernel.dtype,
           "loss": float(loss), "changed": any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights())),
           "digest": weights(model)}
    htf.set_precision("fp32")
    return out


res["fp16"], res["bf16"] = fp16_run(), bf16_run()


# --- distribute's options: state carried over, Horovod options passed through, misuse refused --------
def options():
    out = {}
    model, _ = twins()  # identical on both ranks: a local step keeps them so
    adam = keras.optimizers.Adam(1e-2)
    adam.apply(grads_of(model, images[0], labels[0]), model.trainable_variables)
    out["state_kept"] = digest(htf.distribute(model, adam).variables) == digest(adam.variables)
    lso = htf.distribute(model, keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(LR)),
                         backward_passes_per_step=2)
    out["lso_accumulation"] = lso.inner_optimizer.gradient_accumulation_steps
    # prescale_factor=2 reaches hvd.grouped_allreduce: the same as one process at twice the rate
    model, ref = twins()
    htf.distribute(model, keras.optimizers.SGD(LR), prescale_factor=2.0).apply(
        grads_of(model, images[0][mine], labels[0][mine]), model.trainable_variables)
    keras.optimizers.SGD(2 * LR).apply(grads_of(ref, images[0], labels[0]), ref.trainable_variables)
    out["prescale_max_abs_diff"] = compare(model, ref, [], LR)["max_abs_diff"]
    misuse = {"unknown_option": lambda: htf.distribute(model, keras.optimizers.SGD(LR), prescale=2.0),
              "bad_compression": lambda: htf.distribute(model, keras.optimizers.SGD(LR), compression="int8"),
              "twice": lambda: htf.distribute(model, htf.distribute(model, keras.optimizers.SGD(LR))),
              "inner_distributed": lambda: htf.distribute(model, keras.optimizers.LossScaleOptimizer(
                  htf.distribute(model, keras.optimizers.SGD(LR)))),
              "extra_not_a_dict": lambda: htf.save_checkpoint(out_dir / "none", 1, model, adam, 3)}
    for name, call in misuse.items():
        try:
            call()
            out[name] = None
        except (TypeError, ValueError) as e:
            out[name] = type(e).__name__
    return out


res["options"] = options()


# --- checkpoints: extra round trip; a newer checkpoint of another model is skipped -------------------
def checkpoints():
    ckpt = out_dir / "ckpt"
    model, _ = twins()
    dopt = htf.distribute(model, keras.optimizers.SGD(LR, momentum=0.9))
    dopt.apply(grads_of(model, images[0][mine], labels[0][mine]), model.trainable_variables)
    htf.save_checkpoint(ckpt, 1, model, dopt, extra={"lr": LR, "note": "digits"})
    keras.utils.set_random_seed(7)
    other = build("mlp", "tensorflow", {"hidden": [16]}, input_shape=[1, 8, 8], num_classes=10)
    htf.save_checkpoint(ckpt, 2, other, keras.optimizers.SGD(LR, momentum=0.9))
    keras.utils.set_random_seed(3 + rank)  # a fresh model, different on each rank
    fresh = build("mlp", "tensorflow", {"hidden": [32, 32]}, input_shape=[1, 8, 8], num_classes=10)
    fopt = htf.distribute(fresh, keras.optimizers.SGD(LR, momentum=0.9))
    epoch, extra = htf.load_checkpoint(ckpt, fresh, fopt)
    return {"epoch": epoch, "extra": extra, "saved": weights(model), "loaded": weights(fresh),
            "saved_opt": digest(dopt.variables), "loaded_opt": digest(fopt.variables)}


res["checkpoint"] = checkpoints()

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

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
