"""Sharded optimizer state (ZeRO stages 1 and 2) on real Horovod ranks; writes OUT/rank<r>.json.

    sharded.py OUT CHECKPOINT_DIR train   (2 ranks) equivalence against unsharded data parallelism, the
                                          fp16 overflow check, memory; then a checkpoint and 10 more steps
    sharded.py OUT CHECKPOINT_DIR resume  (1 rank) that checkpoint read at 1 rank, the same 10 steps

Every scenario trains one model three ways in the same process, from the same start on the same data:
unsharded (`ht.distribute`), stage 1 and stage 2, and reports how far apart the parameters end.
"""
import copy
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s._torch_sharded import storage_bytes

out_dir, ckpt_dir, phase = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
ht.init()
rank, size = ht.rank(), ht.size()
res = {"rank": rank, "size": size}
BATCH = 16  # global, per step: each of the ranks reads its part


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # tensors of many sizes, so shard boundaries fall inside tensors
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 33),
                               torch.nn.Tanh(), torch.nn.Linear(33, 10))


def groups(model, weight_decay):
    """Two param groups, as users write them: no weight decay on biases."""
    return [{"params": [p for n, p in model.named_parameters() if n.endswith("weight")], "weight_decay": weight_decay},
            {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0}]


def batch(step: int):
    """This rank's part of the step's global batch (all of it at one rank)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    part = BATCH // size
    return x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]


class Lion(torch.optim.Optimizer):
    """A user's own optimizer (element-wise: sign of an interpolated momentum)."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "beta1": beta1, "beta2": beta2, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(group["beta1"] * m + (1 - group["beta1"]) * p.grad), alpha=-group["lr"])
                m.mul_(group["beta2"]).add_(p.grad, alpha=1 - group["beta2"])


OPTIMIZERS = {
    "adamw": lambda m: torch.optim.AdamW(groups(m, 0.1), lr=3e-3),
    "adam": lambda m: torch.optim.Adam(groups(m, 0.01), lr=3e-3),
    "sgd": lambda m: torch.optim.SGD(groups(m, 1e-3), lr=0.05, momentum=0.9),
    "lion": lambda m: Lion(groups(m, 0.1), lr=1e-3),
}


def train(model, optimizer, steps, *, first=0, precision="fp32", clip=None, passes=1, scaler=None, poison=None):
    """`steps` optimizer steps of `passes` backward passes each; returns which were applied."""
    applied = []
    for s in range(first, first + steps):
        x, y = batch(s)
        part = len(x) // passes
        for k in range(passes):
            with ht.autocast(precision):
                loss = F.cross_entropy(model(x[k * part:(k + 1) * part]), y[k * part:(k + 1) * part]) / passes
            if poison is not None and s == poison[0] and rank == poison[1]:
                loss = loss + math.inf * model[-1].bias[0]  # one gradient element overflows, on one rank only
            (scaler.scale(loss) if scaler is not None else loss).backward()
        applied.append(ht.step(optimizer, scaler=scaler, clip_grad_norm=clip))
        optimizer.zero_grad()
    return applied


def max_diff(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def same_on_every_rank(model) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return bool(torch.equal(ht.allreduce(flat, ht.Average), flat)) and bool(torch.equal(
        ht.allreduce(flat, ht.Sum) / size, flat))


def scenario(optimizer: str, steps: int, **kw) -> dict:
    """Unsharded, stage 1 and stage 2 from one start: the stages' largest distance from unsharded."""
    models, applied = {}, {}
    for stage in (0, 1, 2):
        model = make_model()
        opt = ht.distribute(model, OPTIMIZERS[optimizer](model), compression=kw.get("compression", "none"),
                            backward_passes_per_step=kw.get("passes", 1), shard_optimizer_state=stage)
        scaler = ht.grad_scaler("fp16") if kw.get("fp16") else None
        args = {k: v for k, v in kw.items() if k not in ("fp16", "compression")}
        applied[stage] = train(model, opt, steps, scaler=scaler, **args)
        models[stage] = model
    moved = max_diff(models[0], make_model())
    return {"stage1": max_diff(models[1], models[0]), "stage2": max_diff(models[2], models[0]), "moved": moved,
            "applied": {str(s): a for s, a in applied.items()},
            "same_on_every_rank": all(same_on_every_rank(m) for m in models.values())}


def with_gpu_collectives(run):
    """`run()` with the reduce-scatter and allgather that GPU chunks take, on these CPU tensors (CPU
    chunks allreduce and broadcast: hvdk8s._torch_sharded._on_cpu)."""
    import hvdk8s._torch_sharded as sharded

    on_cpu, sharded._on_cpu = sharded._on_cpu, lambda t: False
    try:
        return run()
    finally:
        sharded._on_cpu = on_cpu


def memory_at_the_update(stage: int) -> dict:
    """Bytes held as the optimizer updates the parameters (gradients reduced, state there): optimizer
    state and gradients, measured off the tensors' storages."""
    model = make_model()
    opt = ht.distribute(model, torch.optim.Adam(model.parameters(), lr=1e-3), shard_optimizer_state=stage)

    def held(*_):
        if stage:
            seen.update(opt.memory())
        else:
            seen.update(optimizer_state=storage_bytes(v for s in opt.state.values() for v in s.values()),
                        gradients=storage_bytes(p.grad for p in model.parameters()))

    seen = {}
    (opt.inner if stage else opt).register_step_pre_hook(held)
    for s in range(2):  # the second: Adam's state exists
        x, y = batch(s)
        F.cross_entropy(model(x), y).backward()
        ht.step(opt)
        opt.zero_grad()
    return seen


if phase == "train":
    res["equivalence"] = {
        "adamw, bf16, clipping": scenario("adamw", 40, precision="bf16", clip=0.5),
        "adam, 2 passes per step, clipping": scenario("adam", 30, passes=2, clip=0.5),
        "sgd momentum": scenario("sgd", 30),
        "own optimizer (Lion)": scenario("lion", 30),
        "sgd momentum, fp16 compression": scenario("sgd", 10, compression="fp16"),
        "adamw, fp16 loss scaling, clipping": scenario("adamw", 12, fp16=True, clip=1.0, poison=(5, 0)),
        "adam, 2 passes, clipping, GPU collectives": with_gpu_collectives(
            lambda: scenario("adam", 30, passes=2, clip=0.5)),
    }
    res["memory"] = {str(stage): memory_at_the_update(stage) for stage in (0, 1, 2)}
    res["parameters"] = sum(p.numel() for p in make_model().parameters())
    # A checkpoint at 2 ranks (stage 2), then 10 more steps: the resume phase must land where these do.
    model = make_model()
    opt = ht.distribute(model, OPTIMIZERS["adamw"](model), shard_optimizer_state=2)
    train(model, opt, 10, clip=0.5)
    saved = ht.save_checkpoint(ckpt_dir, 1, model, opt)
    res["checkpoint"] = None if saved is None else str(saved)
    train(model, opt, 10, first=10, clip=0.5)
    res["continued"] = [p.detach().reshape(-1).tolist() for p in model.parameters()]
else:  # resume at 1 rank: sharded (loaded after distribute) and unsharded (loaded before)
    finals = {}
    for stage in (1, 0):
        model = make_model()
        opt = OPTIMIZERS["adamw"](model)
        if stage:
            opt = ht.distribute(model, opt, shard_optimizer_state=stage)
        epoch, extra = ht.load_checkpoint(ckpt_dir, model, opt)
        if not stage:
            opt = ht.distribute(model, opt)
        res[f"resumed_epoch_stage{stage}"] = epoch
        train(model, opt, 10, first=10, clip=0.5)
        finals[stage] = [p.detach().reshape(-1).tolist() for p in model.parameters()]
    res["continued"] = finals

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
