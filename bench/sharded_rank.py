"""One rank of the sharded-optimizer benchmark: Adam on one model, under hvdk8s (unsharded, stage 1,
stage 2) or torch DDP with torch's ZeroRedundancyOptimizer.

    python -m hvdk8s.bench.sharded_rank CONFIG_JSON

CONFIG_JSON: {"mode": "hvdk8s" | "ddp", "stage": 0 | 1 | 2 (hvdk8s), "model": "mlp-30m" | "mlp",
"batch": N, "steps": N, "warmup": N, "out": PATH}. Rank 0 writes {"seconds_per_step", "memory":
{"optimizer_state", "gradients"}}: the wall time between two barriers over `steps` steps, and the bytes
each holds as its optimizer updates the parameters (gradients reduced, state allocated), measured off
the tensors' storages, the largest over the ranks (the rank that runs out of memory first sets a job's
limit).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from hvdk8s._torch_sharded import storage_bytes
from hvdk8s.bench.step_rank import Mode, batch, timed
from hvdk8s.models import build as build_model

# name: (registry model, its arguments, dataset info)
MODELS = {
    "mlp-30m": ("mlp", {"hidden": [4096, 4096]}, {"input_shape": [3, 32, 32], "num_classes": 10}),  # 29.4M
    "mlp": ("mlp", {"hidden": [256]}, {"input_shape": [3, 32, 32], "num_classes": 10}),  # 0.8M: --quick
}


def build(config: dict, mode: Mode):
    registered, args, info = MODELS[config["model"]]
    torch.manual_seed(0)
    model = build_model(registered, "pytorch", args, **info).to(mode.device)
    if mode.kind == "hvdk8s":
        optimizer = mode.lib.distribute(model, torch.optim.Adam(model.parameters(), lr=1e-4), compression="none",
                                        shard_optimizer_state=config["stage"])
        return model, model, optimizer
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    # Gradients as views of DDP's buckets: one copy of them, as hvdk8s holds (DDP's default keeps two).
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    return model, ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)


def held(model, optimizer) -> dict:
    """Optimizer state and gradient bytes on this rank now."""
    if hasattr(optimizer, "memory"):  # hvdk8s's sharded optimizer
        mem = optimizer.memory()
        return {"optimizer_state": mem["optimizer_state"], "gradients": mem["gradients"]}
    state = optimizer.optim.state if hasattr(optimizer, "optim") else optimizer.state  # torch's ZeRO: its shard
    return {"optimizer_state": storage_bytes(v for s in state.values() for v in s.values()),
            "gradients": storage_bytes(p.grad for p in model.parameters())}


def largest_over_ranks(mode: Mode, values: dict) -> dict:
    t = torch.tensor([float(v) for v in values.values()], dtype=torch.float64)
    if mode.kind == "hvdk8s":
        import horovod.torch as hvd

        t = hvd.allgather(t[None], name="bench.memory").max(dim=0).values
    else:
        mode.lib.all_reduce(t, op=mode.lib.ReduceOp.MAX)
    return {k: int(v) for k, v in zip(values, t.tolist())}


def main(config: dict) -> None:
    mode = Mode(config["mode"], "none")
    _, _, info = MODELS[config["model"]]
    model, forward, optimizer = build(config, mode)
    x, y = (t.to(mode.device) for t in batch("mlp", config["batch"], info))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(forward(x), y).backward()
        optimizer.step()

    # Measured where a rank holds the most: as the optimizer updates (gradients reduced, state there).
    updating = optimizer.inner if hasattr(optimizer, "inner") else getattr(optimizer, "optim", optimizer)
    at_update = {}
    hook = updating.register_step_pre_hook(lambda *_: at_update.update(held(model, optimizer)))
    for _ in range(config.get("warmup", 2)):
        step()
    hook.remove()
    memory = largest_over_ranks(mode, at_update)
    seconds = timed(step, mode, config["steps"])
    if mode.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"seconds_per_step": seconds, "memory": memory}, f)
    mode.close()


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
