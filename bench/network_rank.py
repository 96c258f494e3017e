"""One rank of the emulated-network benchmark (hvdk8s.bench.network): training steps of a model whose
gradients are large enough to be bandwidth-bound, under hvdk8s.torch with a compression, or torch DDP
(gloo) with its own communication hook (fp16, PowerSGD).

    python -m hvdk8s.bench.network_rank CONFIG_JSON

CONFIG_JSON: {"mode": "hvdk8s" | "ddp", "compression": "none" | "fp16" | "powersgd", "rank": R (PowerSGD),
"model": "mlp-30m" | "mlp", "batch": N, "steps": N, "out": PATH}. Rank 0 writes {"seconds_per_step",
"sent_bytes"}: wall seconds per step between two barriers, and the gradient bytes each rank hands to the
allreduce per step (what the wire carries grows with it).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from hvdk8s.compression import should_compress
from hvdk8s.bench.sharded_rank import MODELS
from hvdk8s.bench.step_rank import Mode, batch, timed
from hvdk8s.models import build as build_model

WARMUP = 3
DDP_MIN_COMPRESSION_RATE = 2.0  # as hvdk8s's default


def sent_bytes(model: torch.nn.Module, compression: str, rank: int, optimizer=None) -> int:
    params = [p for p in model.parameters() if p.requires_grad]
    if compression == "fp16":
        return 2 * sum(p.numel() for p in params)
    if compression != "powersgd":
        return 4 * sum(p.numel() for p in params)
    if optimizer is not None and hasattr(optimizer, "matrices"):  # hvdk8s's: exactly what it compresses
        matrices = optimizer.matrices.values()
        return 4 * (sum((m.rows + m.cols) * m.rank for m in matrices) + sum(p.numel() for p in optimizer.whole))
    total = 0  # DDP's hook decides per matrix by the same rule (rank-r factors 2x smaller), vectors whole
    for p in params:
        rows, cols = (p.shape[0], p.numel() // p.shape[0]) if p.dim() >= 2 else (0, 0)
        squeezed = p.dim() >= 2 and should_compress(rows, cols, rank, DDP_MIN_COMPRESSION_RATE)
        total += (rows + cols) * min(rank, rows, cols) if squeezed else p.numel()
    return 4 * total


def main(config: dict) -> None:
    mode = Mode(config["mode"], "none")
    torch.set_num_threads(config.get("threads", torch.get_num_threads()))  # the ranks of all nodes share one machine
    registered, args, info = MODELS[config["model"]]
    torch.manual_seed(0)
    model = build_model(registered, "pytorch", args, **info).to(mode.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    compression, rank = config["compression"], config.get("rank", 4)
    forward = model
    if mode.kind == "hvdk8s":
        settings = {"powersgd": {"rank": rank, "start_step": 0}} if compression == "powersgd" else {}
        optimizer = mode.lib.distribute(model, optimizer, compression=compression, **settings)
    else:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        # PowerSGD's hook waits on a collective inside another's callback; gloo runs those callbacks on its
        # few worker threads, so with several buckets in flight it deadlocked (a 29.4M-parameter MLP, 5
        # buckets: every thread waiting): its model goes in one bucket (hvdk8s's PowerSGD does not overlap
        # backward either).
        forward = DistributedDataParallel(model, bucket_cap_mb=4096 if compression == "powersgd" else 25)
        if compression == "fp16":
            forward.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif compression == "powersgd":
            # Error feedback and warm start need start_powerSGD_iter > 1: plain allreduce for the warm-up.
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                                start_powerSGD_iter=2, min_compression_rate=DDP_MIN_COMPRESSION_RATE)
            forward.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    x, y = (t.to(mode.device) for t in batch("mlp", config["batch"], info))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(forward(x), y).backward()
        optimizer.step()

    for _ in range(WARMUP):
        step()
    seconds = timed(step, mode, config["steps"])
    if mode.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"seconds_per_step": seconds, "sent_bytes": sent_bytes(model, compression, rank, optimizer)}, f)
    mode.close()


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
