"""Runs on 2 real Horovod ranks; writes what it observed to OUT/rank<r>.json for the test to check.

Covers: allreduce average and sum, broadcast, metric averaging, broadcast of parameters and optimizer
state from rank 0, data-parallel equivalence (fp32 and fp16), and rank-sharded loading."""
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s.data.shards import ShardedDataset
from hvdk8s.data.torch import ShardedLoader
from hvdk8s.models import build
from hvdk8s.train import parameter_digest

out_dir, shard_dir = Path(sys.argv[1]), Path(sys.argv[2])
ht.init()
rank, size = ht.rank(), ht.size()
res = {"rank": rank, "size": size, "threads": torch.get_num_threads()}

# --- collectives ---------------------------------------------------------------------------------
t = torch.arange(4, dtype=torch.float32) + 10 * rank
res["allreduce_average"] = ht.allreduce(t).tolist()
res["allreduce_sum"] = ht.allreduce(t, ht.Sum).tolist()
res["metric_average"] = ht.metric_average(float(rank + 1))
b = torch.full((3,), float(rank + 7))
res["broadcast"] = ht.hvd.broadcast(b, root_rank=0).tolist()

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

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))
