"""Runs on 2 real Horovod ranks; writes what it observed to OUT/rank<r>.json for the test to check.

Covers: allreduce average and sum, broadcast, metric averaging, broadcast of parameters and optimizer
state from rank 0, data-parallel equivalence (fp32 and fp16 compression), clipping and mixed precision
through ht.step/ht.autocast/ht.grad_scaler, learning-rate scaling, resuming past checkpoints of other
models, and rank-sharded loading."""
import copy
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s.data.shards import ShardedDataset
from hvdk8s.data.torch import ShardedLoader
from hvdk8s.models import build

out_dir, shard_dir = Path(sys.argv[1]), Path(sys.argv[2])
ht.init()
rank, size = ht.rank(), ht.size()
res = {"rank": rank, "size": size, "threads": torch.get_num_threads(), "cycle_time": os.environ.get("HOROVOD_CYCLE_TIME")}
ht.share_cores(3)  # a share given explicitly (an elastic job re-shares after its ranks change)
res["threads_given"] = torch.get_num_threads()
ht.share_cores()

# --- collectives ---------------------------------------------------------------------------------
t = torch.arange(4, dtype=torch.float32) + 10 * rank
res["allreduce_average"] = ht.allreduce(t).tolist()
res["allreduce_sum"] = ht.allreduce(t, ht.Sum).tolist()
res["metric_average"] = ht.metric_average(float(rank + 1))
b = torch.nn.Linear(3, 1, bias=False)
with torch.no_grad():
    b.weight.fill_(float(rank + 7))
ht.broadcast_state(b)  # the public verb: every rank takes rank 0's parameters
res["broadcast"] = b.weight.flatten().tolist()



def parameter_digest(tensors):
    """A hash of named tensors, to compare models across ranks."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# --- broadcast of parameters and optimizer state -------------------------------------------------
torch.manual_seed(100 + rank)  # every rank starts different
model = build("mlp", "pytorch", {"hidden": [16]}, input_shape=[1, 8, 8], num_classes=10)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
if rank == 0:  # only the root has optimizer state (as after a resume)
    F.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([1, 2, 3, 4])).backward()
    opt.step()
    opt.zero_grad()


def optimizer_digest(o):
    state = o.state_dict()["state"]
    return parameter_digest({f"{k}.{n}": v for k, s in state.items() for n, v in s.items()
                             if isinstance(v, torch.Tensor)})


res["before_broadcast"] = parameter_digest(model.state_dict())
res["opt_state_before"] = optimizer_digest(opt) if rank == 0 else None
dopt = ht.distribute(model, opt)  # wraps, keeps rank 0's restored state, broadcasts it
res["after_broadcast"] = parameter_digest(model.state_dict())
res["opt_state"] = optimizer_digest(dopt)
res["opt_hparams"] = {k: v for k, v in dopt.param_groups[0].items() if k in ("lr", "betas", "weight_decay")}


# --- data-parallel equivalence --------------------------------------------------------------------
def equivalence(model_name, model_args, data_kw, make_batch, loss_fn, compression, steps):
    torch.manual_seed(0)
    model = build(model_name, "pytorch", model_args, **data_kw)
    reference = copy.deepcopy(model)
    lr = 0.1
    dopt = ht.distribute(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                         compression=compression)
    ropt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9)
    worst, worst_ratio = 0.0, 0.0
    for step in range(steps):
        x, y = make_batch(step)
        half = len(x) // size
        loss_fn(model(x[rank * half:(rank + 1) * half]), y[rank * half:(rank + 1) * half]).backward()
        dopt.step()
        dopt.zero_grad()
        # fp16 rounding bound, per element: from each half's gradient magnitude
        halves = []
        for r in range(size):
            probe = copy.deepcopy(reference)
            loss_fn(probe(x[r * half:(r + 1) * half]), y[r * half:(r + 1) * half]).backward()
            halves.append([p.grad.abs() for p in probe.parameters()])
        loss_fn(reference(x), y).backward()
        ropt.step()
        ropt.zero_grad()
        for p, q, *gs in zip(model.parameters(), reference.parameters(), *halves):
            diff = (p.detach() - q.detach()).abs()
            worst = max(worst, float(diff.max()))
            bound = lr * 2.0 ** -9 * sum(gs) + 1e-6
            worst_ratio = max(worst_ratio, float((diff / bound).max()))
    return {"max_abs_diff": worst, "max_diff_over_fp16_bound": worst_ratio}


gen = torch.Generator().manual_seed(1)
images = torch.randn(3, 64, 1, 8, 8, generator=gen)
labels = torch.randint(0, 10, (3, 64), generator=gen)
tokens = torch.randint(0, 50, (3, 8, 13), generator=gen)
lm_loss = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())  # noqa: E731
mlp = ("mlp", {"hidden": [32, 32]}, {"input_shape": [1, 8, 8], "num_classes": 10},
       lambda s: (images[s], labels[s]), F.cross_entropy)
lm = ("transformer", {"d_model": 32, "heads": 4, "layers": 1, "d_ff": 64, "max_len": 16},
      {"vocab_size": 50, "seq_len": 12}, lambda s: (tokens[s, :, :-1], tokens[s, :, 1:]), lm_loss)
res["equivalence"] = {
    "mlp_fp32": equivalence(*mlp, "none", steps=3),
    "mlp_fp16": equivalence(*mlp, "fp16", steps=1),
    "transformer_fp32": equivalence(*lm, "none", steps=2),
}

# --- ht.step: clipping and mixed precision ---------------------------------------------------------
mlp_args = ("mlp", "pytorch", {"hidden": [32, 32]})
mlp_kw = {"input_shape": [1, 8, 8], "num_classes": 10}


def max_diff(a, b):
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def clipped_fp32(clip, passes, steps=3):
    """2 ranks x `passes` backward passes of a part of the batch each, through ht.step with clipping,
    against one process on the whole batch clipped by torch directly (and one not clipped at all)."""
    torch.manual_seed(0)
    model = build(*mlp_args, **mlp_kw)
    reference, unclipped = copy.deepcopy(model), copy.deepcopy(model)
    dopt = ht.distribute(model, sgd(model.parameters()), compression="none", backward_passes_per_step=passes)
    ropt, uopt = sgd(reference.parameters()), sgd(unclipped.parameters())
    norms, applied = [], []
    for s in range(steps):
        x, y = images[s], labels[s]
        part = len(x) // (size * passes)
        for k in range(passes):  # each pass's mean loss / passes: the passes sum to this rank's mean
            lo = (rank * passes + k) * part
            (F.cross_entropy(model(x[lo:lo + part]), y[lo:lo + part]) / passes).backward()
        applied.append(ht.step(dopt, clip_grad_norm=clip))
        dopt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)))
        ropt.step()
        ropt.zero_grad()
        F.cross_entropy(unclipped(x), y).backward()
        uopt.step()
        uopt.zero_grad()
    return {"max_abs_diff": max_diff(model, reference), "clipping_effect": max_diff(reference, unclipped),
            "norms_before_clip": norms, "clip": clip, "applied": applied,
            "digest": parameter_digest(model.state_dict())}


def fp16_amp(clip, steps=4):
    """autocast fp16 + GradScaler + clipping on half batches, against fp32 on the whole batch and against
    one process doing fp16 AMP on the whole batch by hand; then one step whose loss overflows on rank 1
    only."""
    torch.manual_seed(0)
    model = build(*mlp_args, **mlp_kw)
    initial, reference, amp_reference = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    dopt = ht.distribute(model, sgd(model.parameters()), compression="none")
    ropt, aopt = sgd(reference.parameters()), sgd(amp_reference.parameters())
    scaler, amp_scaler = ht.grad_scaler("fp16"), torch.amp.GradScaler("cpu")
    half = 64 // size
    applied = []
    for s in range(steps):
        x, y = images[s % 3], labels[s % 3]
        with ht.autocast("fp16"):
            out = model(x[rank * half:(rank + 1) * half])
            loss = F.cross_entropy(out, y[rank * half:(rank + 1) * half])
        scaler.scale(loss).backward()
        applied.append(ht.step(dopt, scaler=scaler, clip_grad_norm=clip))
        dopt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
        ropt.step()
        ropt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            amp_loss = F.cross_entropy(amp_reference(x), y)
        amp_scaler.scale(amp_loss).backward()
        amp_scaler.unscale_(aopt)
        torch.nn.utils.clip_grad_norm_(amp_reference.parameters(), clip)
        amp_scaler.step(aopt)
        amp_scaler.update()
        aopt.zero_grad()
    res = {"forward_dtype": str(out.dtype), "enabled": scaler.is_enabled(), "applied": applied,
           "scale": scaler.get_scale(), "finite": all(bool(p.isfinite().all()) for p in model.parameters()),
           "digest": parameter_digest(model.state_dict()),
           "max_abs_diff": max_diff(model, reference), "max_update": max_diff(reference, initial),
           "max_abs_diff_amp_reference": max_diff(model, amp_reference)}
    # A loss too large for fp16 gradients on rank 1 alone: the average holds inf/nan on both ranks.
    before = parameter_digest(model.state_dict())
    x, y = images[0], labels[0]
    with ht.autocast("fp16"):
        loss = F.cross_entropy(model(x[rank * half:(rank + 1) * half]), y[rank * half:(rank + 1) * half])
    scaler.scale(loss * (1e30 if rank == 1 else 1.0)).backward()
    res["overflow"] = {"scale_before": scaler.get_scale(), "applied": ht.step(dopt, scaler=scaler, clip_grad_norm=clip),
                       "scale_after": scaler.get_scale(),
                       "unchanged": parameter_digest(model.state_dict()) == before}
    dopt.zero_grad()
    return res


def bf16_amp():
    torch.manual_seed(0)
    model = build(*mlp_args, **mlp_kw)
    dopt = ht.distribute(model, sgd(model.parameters()), compression="none")
    half = 64 // size
    with ht.autocast("bf16"):
        out = model(images[0][rank * half:(rank + 1) * half])
        loss = F.cross_entropy(out, labels[0][rank * half:(rank + 1) * half])
    before = parameter_digest(model.state_dict())
    loss.backward()
    applied = ht.step(dopt, scaler=ht.grad_scaler("bf16"))  # None: bf16 needs no loss scaling
    after = parameter_digest(model.state_dict())
    with ht.autocast("fp32"):
        fp32_dtype = str(model(images[0][:2]).dtype)
    try:
        ht.autocast("fp8")
        bad = None
    except ValueError as e:
        bad = str(e)
    return {"forward_dtype": str(out.dtype), "applied": applied, "changed": after != before, "digest": after,
            "scaler": ht.grad_scaler("bf16"), "fp32_forward_dtype": fp32_dtype, "bad_precision": bad}


res["step"] = {
    "clip_fp32": clipped_fp32(clip=0.05, passes=1),
    "clip_fp32_accumulated": clipped_fp32(clip=0.05, passes=2),
    "fp16": fp16_amp(clip=0.05),
    "bf16": bf16_amp(),
}
res["scaled_lr"] = [ht.scaled_learning_rate(0.1), ht.scaled_learning_rate(0.1, "sqrt"),
                    ht.scaled_learning_rate(0.1, backward_passes_per_step=2), ht.scaled_learning_rate(0.1, "none")]

# --- the optimizer's direct gradient launch (hvdk8s._torch_launch) against Horovod's own -----------
import types  # noqa: E402

import horovod.torch as hvd  # noqa: E402


def averaged_gradients(horovods_launch, **options):
    """Each parameter's gradient after one 2-rank synchronize(), launched by hvdk8s or by Horovod."""
    torch.manual_seed(0)
    model = build(*mlp_args, **mlp_kw)
    dopt = ht.distribute(model, sgd(model.parameters()), compression="none", **options)
    direct = dopt._allreduce_grad_async.__name__ == "launch"
    if horovods_launch:
        dopt._allreduce_grad_async = types.MethodType(type(dopt)._allreduce_grad_async, dopt)
    half = 64 // size
    F.cross_entropy(model(images[0][rank * half:(rank + 1) * half]), labels[0][rank * half:(rank + 1) * half]).backward()
    dopt.synchronize()
    return direct, [p.grad.clone() for p in model.parameters()]


res["launch"] = {}
for label, options in {"average": {}, "average, predivided": {"gradient_predivide_factor": 2.0},
                       "sum": {"op": ht.Sum}, "adasum": {"op": hvd.Adasum}}.items():
    direct, ours = averaged_gradients(False, **options)
    _, horovods = averaged_gradients(True, **options)
    res["launch"][label] = {"direct": direct, "identical": all(torch.equal(a, b) for a, b in zip(ours, horovods))}

# --- resume skips checkpoints of other models ----------------------------------------------------
ckpt = out_dir / "ckpt"


def trained(hidden, seed, groups=1):
    """An mlp after one SGD step (so momentum state exists); the same on every rank."""
    torch.manual_seed(seed)
    m = build("mlp", "pytorch", {"hidden": hidden}, **mlp_kw)
    params = list(m.parameters())
    opt = sgd(params if groups == 1 else [{"params": params[:1]}, {"params": params[1:]}])
    F.cross_entropy(m(images[0]), labels[0]).backward()
    opt.step()
    opt.zero_grad()
    return m, opt


mine, mine_opt = trained([16], seed=3)
ht.save_checkpoint(ckpt, 1, mine, mine_opt, extra={"note": "mine"})
ht.save_checkpoint(ckpt, 2, *trained([24], seed=3))  # another model: other shapes
ht.save_checkpoint(ckpt, 3, *trained([16], seed=5, groups=2))  # same shapes, optimizer does not fit
torch.manual_seed(10 + rank)
fresh = build("mlp", "pytorch", {"hidden": [16]}, **mlp_kw)
fresh_opt = sgd(fresh.parameters())
epoch, extra = ht.load_checkpoint(ckpt, fresh, fresh_opt)
res["resume"] = {"epoch": epoch, "file": Path(extra["path"]).name, "note": extra.get("note"),
                 "model_restored": parameter_digest(fresh.state_dict()) == parameter_digest(mine.state_dict()),
                 "optimizer_restored": optimizer_digest(fresh_opt) == optimizer_digest(mine_opt)}

# --- rank-sharded loading -------------------------------------------------------------------------
ds = ShardedDataset(shard_dir)
loader = ShardedLoader(ds, batch_size=7, rank=rank, size=size, seed=5)
res["shards"] = {}
for epoch in (1, 2):
    loader.set_epoch(epoch)
    ids, steps = [], 0
    for batch in loader:
        ids += batch.y.tolist()
        steps += 1
    res["shards"][str(epoch)] = {"ids": ids, "steps": steps}

# --- a step waiting for a slow peer: the training thread sleeps (Horovod's own wait spins) ---------
import time  # noqa: E402

# plain averaging (allreduces started by backward's hooks) and PowerSGD (its allreduces start in step())
for key, settings in (("slow_peer_wait", {}),
                      ("slow_peer_wait_powersgd", {"compression": "powersgd", "powersgd": {"rank": 2, "start_step": 0}})):
    waiter = torch.nn.Linear(256, 256)
    waiter_opt = ht.distribute(waiter, torch.optim.SGD(waiter.parameters(), lr=0.01), **settings)
    if rank == 1:
        time.sleep(1.5)  # rank 1 is late: its backward (whose hooks start its allreduces) comes 1.5 s later
    waiter(torch.ones(4, 256)).sum().backward()
    wall, cpu = time.perf_counter(), time.thread_time()
    waiter_opt.step()
    res[key] = {"wall_s": time.perf_counter() - wall, "thread_cpu_s": time.thread_time() - cpu}

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
