"""Sharded optimizer state (ZeRO stages 1 and 2) for Keras 3 on real Horovod ranks; writes OUT/rank<r>.json.

    sharded_tf.py OUT CHECKPOINT_DIR train   (2 ranks) equivalence against unsharded data parallelism, the
                                             fp16 overflow check, memory; then a checkpoint and 10 more steps
    sharded_tf.py OUT CHECKPOINT_DIR resume  (1 rank) that checkpoint read at 1 rank, the same 10 steps

Every scenario trains one model three ways in the same process, from the same start on the same data:
unsharded (`htf.distribute`), stage 1 and stage 2, each step a traced `optimizer.apply` (as model.fit's),
and reports how far apart the variables end.
"""
import json
import math
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import hvdk8s.tensorflow as htf

out_dir, ckpt_dir, phase = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
htf.init()
rank, size = htf.rank(), htf.size()
res = {"rank": rank, "size": size}
BATCH = 16  # global, per step: each of the ranks reads its part


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)  # variables of many sizes, so shard boundaries fall inside them
    return keras.Sequential([keras.Input((8, 8)), keras.layers.Flatten(), keras.layers.Dense(96, activation="tanh"),
                             keras.layers.Dense(33, activation="tanh"), keras.layers.Dense(10)])


def batch(step: int):
    """This rank's part of the step's global batch (all of it at one rank)."""
    g = np.random.default_rng(1000 + step)
    x, y = g.standard_normal((BATCH, 8, 8)).astype("float32"), g.integers(0, 10, BATCH)
    part = BATCH // size
    return x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]


class Lion(keras.optimizers.Optimizer):
    """A user's own optimizer (element-wise: sign of an interpolated momentum)."""

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.99, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta_1, self.beta_2 = beta_1, beta_2

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums = self.add_optimizer_variables(var_list, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        m = self._momentums[self._get_variable_index(variable)]
        lr = tf.cast(learning_rate, variable.dtype)
        self.assign_sub(variable, lr * tf.sign(self.beta_1 * m + (1 - self.beta_1) * gradient))
        self.assign(m, self.beta_2 * m + (1 - self.beta_2) * gradient)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2}


def no_decay_on_biases(optimizer):
    optimizer.exclude_from_weight_decay(var_names=["bias"])  # as users write it
    return optimizer


OPTIMIZERS = {
    "adamw": lambda clip: no_decay_on_biases(keras.optimizers.AdamW(3e-3, weight_decay=0.1, global_clipnorm=clip)),
    "adam": lambda clip: keras.optimizers.Adam(3e-3, weight_decay=0.01, global_clipnorm=clip),
    "sgd": lambda clip: keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3, global_clipnorm=clip),
    "lion": lambda clip: Lion(1e-3, weight_decay=0.1, global_clipnorm=clip),
}


def trainer(model, optimizer, passes, fp16):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y, poison):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), "float32"))
            loss += poison * tf.cast(model.trainable_variables[-1][0], "float32")
            if fp16:
                loss = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    def train(steps, first=0, poisoned=None):
        applied = []
        for s in range(first, first + steps):
            x, y = batch(s)
            part = len(x) // passes
            for k in range(passes):  # backward_passes_per_step: the update after the last pass
                before = optimizer.iterations.numpy()
                poison = math.inf if poisoned == (s, rank) else 0.0
                step(x[k * part:(k + 1) * part], y[k * part:(k + 1) * part], tf.constant(poison))
            applied.append(bool(optimizer.iterations.numpy() > before))
        return applied
    return train


def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a.weights, b.weights))


def same_on_every_rank(model) -> bool:
    flat = np.concatenate([np.asarray(w).reshape(-1) for w in model.weights]).astype(np.float64)
    return bool(np.array_equal(htf.allreduce(flat, htf.Average), flat))


def scenario(optimizer: str, steps: int, *, precision="fp32", clip=None, passes=1, compression="none",
             fp16=False, poison=None) -> dict:
    """Unsharded, stage 1 and stage 2 from one start: the stages' largest distance from unsharded."""
    htf.set_precision("fp16" if fp16 else precision)
    models, applied, bias_decay = {}, {}, {}
    for stage in (0, 1, 2):
        model = make_model()
        opt = OPTIMIZERS[optimizer](clip)
        if fp16:
            opt = keras.optimizers.LossScaleOptimizer(opt)
        opt = htf.distribute(model, opt, compression=compression, backward_passes_per_step=passes,
                             shard_optimizer_state=stage)
        plain = getattr(opt, "inner_optimizer", opt)
        bias_decay[stage] = bool(plain.weight_decay) and plain._use_weight_decay(model.layers[-1].bias)
        applied[stage] = trainer(model, opt, passes, fp16)(steps, poisoned=poison)
        models[stage] = model
    moved = max_diff(models[0], make_model())
    htf.set_precision("fp32")
    return {"stage1": max_diff(models[1], models[0]), "stage2": max_diff(models[2], models[0]), "moved": moved,
            "applied": {str(s): a for s, a in applied.items()}, "bias_decay": bias_decay,
            "same_on_every_rank": all(same_on_every_rank(m) for m in models.values())}


def state_bytes(stage: int) -> int:
    """Bytes of optimizer state per variable (Adam's moments) this rank holds, after two steps."""
    model = make_model()
    opt = htf.distribute(model, keras.optimizers.Adam(1e-3), shard_optimizer_state=stage)
    trainer(model, opt, 1, False)(2)
    if stage:
        return opt.memory()["optimizer_state"]
    return sum(np.asarray(v).nbytes for v in opt.variables if len(v.shape) > 0)


if phase == "train":
    res["equivalence"] = {
        "adamw, bf16, clipping": scenario("adamw", 20, precision="bf16", clip=0.5),
        "adam, 2 passes per step, clipping": scenario("adam", 15, passes=2, clip=0.5),
        "sgd momentum": scenario("sgd", 15),
        "own optimizer (Lion)": scenario("lion", 15),
        "sgd momentum, fp16 compression": scenario("sgd", 8, compression="fp16"),
        "adamw, fp16 loss scaling, clipping": scenario("adamw", 10, fp16=True, clip=1.0, poison=(5, 0)),
    }
    res["memory"] = {str(stage): state_bytes(stage) for stage in (0, 1, 2)}
    res["parameters"] = int(sum(np.prod(v.shape) for v in make_model().trainable_variables))
    # A checkpoint at 2 ranks (stage 2), then 10 more steps: the resume phase must land where these do.
    model = make_model()
    opt = htf.distribute(model, OPTIMIZERS["adamw"](0.5), shard_optimizer_state=2)
    train = trainer(model, opt, 1, False)
    train(10)
    saved = htf.save_checkpoint(ckpt_dir, 1, model, opt)
    res["checkpoint"] = None if saved is None else str(saved)
    train(10, first=10)
    res["continued"] = [np.asarray(w).reshape(-1).tolist() for w in model.weights]
else:  # resume at 1 rank: sharded (loaded after distribute) and unsharded (loaded before)
    finals = {}
    for stage in (1, 0):
        model = make_model()
        opt = OPTIMIZERS["adamw"](0.5)
        if stage:
            opt = htf.distribute(model, opt, shard_optimizer_state=stage)
        epoch, extra = htf.load_checkpoint(ckpt_dir, model, opt)
        if not stage:
            opt = htf.distribute(model, opt)
        res[f"resumed_epoch_stage{stage}"] = epoch
        trainer(model, opt, 1, False)(10, first=10)
        finals[stage] = [np.asarray(w).reshape(-1).tolist() for w in model.weights]
    res["continued"] = finals

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
