"""One rank of the Keras 3 sharded-optimizer benchmark: Adam on one model under hvdk8s.tensorflow,
unsharded or at stage 1 or 2 (hvdk8s/_tf_sharded.py), each step a traced `optimizer.apply` as model.fit's.

    python -m hvdk8s.bench.sharded_rank_tf CONFIG_JSON

CONFIG_JSON: {"stage": 0 | 1 | 2, "model": "mlp-30m" | "mlp", "batch": N, "steps": N, "warmup": N,
"out": PATH}. Rank 0 writes {"seconds_per_step", "memory": {"optimizer_state"}}: the wall time between
two barriers over `steps` steps, and the bytes of the optimizer's per-variable state (Adam's moments)
this rank holds after the warm-up, the largest over the ranks.
"""
from __future__ import annotations

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import hvdk8s.tensorflow as htf

# name: hidden layers of an MLP on 3x32x32 inputs, 10 classes
MODELS = {"mlp-30m": [4096, 4096], "mlp": [256]}  # 29.4M and 0.8M (--quick) parameters, as bench.sharded_rank


def build(config: dict):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3 * 32 * 32,)),
                              *[keras.layers.Dense(h, activation="relu") for h in MODELS[config["model"]]],
                              keras.layers.Dense(10)])
    optimizer = htf.distribute(model, keras.optimizers.Adam(1e-4), compression="none",
                               shard_optimizer_state=config["stage"])
    return model, optimizer


def state_bytes(optimizer) -> int:
    if hasattr(optimizer, "memory"):  # sharded: the working copy's state on this rank's slices
        return optimizer.memory()["optimizer_state"]
    return sum(np.asarray(v).nbytes for v in optimizer.variables if len(v.shape) > 0)


def main(config: dict) -> None:
    htf.init()
    model, optimizer = build(config)
    rng = np.random.default_rng(htf.rank())
    x = tf.constant(rng.standard_normal((config["batch"], 3 * 32 * 32)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, config["batch"]))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    for _ in range(config.get("warmup", 2)):
        step().numpy()
    # Each rank's bytes in its own place of a vector summed over the ranks: the largest of them.
    largest = int(max(htf.allreduce(np.eye(htf.size())[htf.rank()] * state_bytes(optimizer), htf.Sum,
                                    name="bench.memory")))
    htf.allreduce(0.0, name="bench.before")
    began = time.perf_counter()
    for _ in range(config["steps"]):
        step()
    step().numpy()  # the last step's result: the queued work is done
    htf.allreduce(0.0, name="bench.after")
    seconds = (time.perf_counter() - began) / (config["steps"] + 1)
    if htf.rank() == 0:
        with open(config["out"], "w") as f:
            json.dump({"seconds_per_step": seconds, "memory": {"optimizer_state": largest}}, f)


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
