"""One rank of a step-time benchmark: the same model, batch and threads under each way of training.

    python -m hvdk8s.bench.step_rank CONFIG_JSON

CONFIG_JSON: {"mode": "plain" | "hvdk8s" | "horovod" | "ddp", "model": "mlp" | "resnet" | "transformer",
"steps": N, "warmup": N, "batch": N, "compression": "none" | "fp16", "out": PATH, "forever": false,
"turns": {"go": FIFO, "done": FIFO} | null}.
Rank 0 writes {"seconds_per_step": ...} to `out`: the wall time between two barriers over `steps`
steps (what the job as a whole runs at). `forever` trains until killed (the contending job). `turns`:
one rank runs `steps` steps each time it is told to, answering with their time (`ranks.taking_turns`).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

from hvdk8s.models import build as build_model

# name: (registry model, its arguments, dataset info). Sizes a 2-core machine runs in tens of
# milliseconds per step; the same for every mode.
MODELS = {
    "mlp": ("mlp", {"hidden": [1024, 1024, 1024, 1024]}, {"input_shape": [3, 32, 32], "num_classes": 10}),  # 6.3M
    "resnet": ("resnet", {"depth": 20}, {"input_shape": [3, 32, 32], "num_classes": 10}),  # 0.27M, conv-heavy
    "transformer": ("transformer", {"d_model": 128, "heads": 4, "layers": 2, "d_ff": 512},
                    {"vocab_size": 1000, "seq_len": 64}),
    # Many small tensors: what Horovod's fusion buffer and cycle time are for.
    "many-small": ("mlp", {"hidden": [64] * 48}, {"input_shape": [64], "num_classes": 10}),
}


def build(name: str) -> tuple[torch.nn.Module, dict]:
    registered, args, info = MODELS[name]
    torch.manual_seed(0)
    return build_model(registered, "pytorch", args, **info), info


def batch(name: str, size: int, info: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if name == "transformer":
        tokens = torch.randint(0, info["vocab_size"], (size, info["seq_len"] + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    return torch.randn(size, *info["input_shape"], generator=g), torch.randint(0, info["num_classes"], (size,), generator=g)


def loss_of(name: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if name == "transformer":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


class Mode:
    """init, wrap and barrier for one way of training."""

    def __init__(self, kind: str, compression: str):
        self.kind, self.compression = kind, compression
        cores = os.cpu_count() or 1
        self.device = torch.device("cpu")
        if kind == "hvdk8s":
            import hvdk8s.torch as ht
            ht.init()  # its own thread share, or the local rank's GPU
            self.rank, self.lib, self.device = ht.rank(), ht, ht.device()
        elif kind == "horovod":
            import horovod.torch as hvd
            hvd.init()
            torch.set_num_threads(max(1, cores // hvd.local_size()))
            self.rank, self.lib = hvd.rank(), hvd
            if torch.cuda.is_available():
                self.device = torch.device("cuda", hvd.local_rank())
        elif kind == "ddp":
            import torch.distributed as dist
            gpu = torch.cuda.is_available()
            dist.init_process_group("nccl" if gpu else "gloo")
            torch.set_num_threads(max(1, cores // int(os.environ["LOCAL_WORLD_SIZE"])))
            self.rank, self.lib = dist.get_rank(), dist
            if gpu:
                self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
                torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", cores)))
            self.rank, self.lib = 0, None
            if torch.cuda.is_available():  # plain PyTorch on the GPU (bench/gpu_check.py)
                self.device = torch.device("cuda", 0)

    def wrap(self, model, optimizer):
        if self.kind == "hvdk8s":
            return model, self.lib.distribute(model, optimizer, compression=self.compression)
        if self.kind == "horovod":
            hvd = self.lib
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            comp = hvd.Compression.fp16 if self.compression == "fp16" else hvd.Compression.none
            return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                   compression=comp)
        if self.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            ddp = DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda" else None)
            if self.compression == "fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            return ddp, optimizer
        return model, optimizer

    def barrier(self) -> None:
        if self.kind in ("hvdk8s", "horovod"):
            self.lib.allreduce(torch.zeros(1), name="bench.barrier")
            self.sync()
        elif self.kind == "ddp":
            self.lib.barrier()
            self.sync()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """End the process group before the interpreter does, once every rank is here: a gloo rank left to
        exit with its group alive, or ending it while its peer has already gone, sometimes aborts
        ("terminate called without an active exception", SIGABRT), which fails the whole torchrun."""
        if self.kind == "ddp":
            self.lib.barrier()
            self.lib.destroy_process_group()


def warmed_step(config: dict, mode: Mode) -> Callable[[], None]:
    """One training step of config's model under `mode`, after its warm-up steps."""
    model, info = build(config["model"])
    model, optimizer = mode.wrap(model.to(mode.device), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    x, y = (t.to(mode.device) for t in batch(config["model"], config["batch"], info))

    def step():
        optimizer.zero_grad()
        loss_of(config["model"], model(x), y).backward()
        optimizer.step()

    for _ in range(config.get("warmup", 3)):  # allocations, Horovod's response cache, DDP's buckets
        step()
    return step


def timed(step: Callable[[], None], mode: Mode, steps: int) -> float:
    """Wall seconds per call of `step` over `steps` calls, between two barriers (the same on every rank)."""
    mode.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    mode.barrier()
    return (time.perf_counter() - start) / steps


def seconds_per_step(config: dict, mode: Mode) -> float:
    """Wall seconds per training step of config's model, between two barriers (the same on every rank)."""
    step = warmed_step(config, mode)
    if config.get("forever"):
        while True:
            step()
    return timed(step, mode, config["steps"])


def take_turns(config: dict, mode: Mode) -> None:
    """One rank taking turns with other processes (config["turns"]: {"go": FIFO, "done": FIFO}): for each
    line on `go`, `steps` steps, then their wall seconds per step as a line on `done`; until `go` ends."""
    step = warmed_step(config, mode)
    with open(config["turns"]["go"]) as go, open(config["turns"]["done"], "w") as done:
        for _ in go:
            start = time.perf_counter()
            for _ in range(config["steps"]):
                step()
            done.write(f"{(time.perf_counter() - start) / config['steps']}\n")
            done.flush()


def main(config: dict) -> None:
    mode = Mode(config["mode"], config.get("compression", "none"))
    if config.get("turns"):
        take_turns(config, mode)
        return
    seconds = seconds_per_step(config, mode)
    if mode.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"seconds_per_step": seconds}, f)
    mode.close()


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
