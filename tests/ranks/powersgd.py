"""PowerSGD (compression="powersgd") on real Horovod ranks; writes OUT/rank<r>.json.

    powersgd.py OUT

Scenarios, each from the same start on the same data (a step's global batch split among the ranks):
- full rank (every matrix compressed at rank min(rows, columns)) against Horovod's plain averaging;
- low rank against the algorithm written out plainly (Vogels et al. 2019, one process on the whole batch:
  M = g + e, P = M Q, P orthonormalized, Q = Mᵀ P, g' = P Qᵀ, e = M - g'), with the warm-up steps;
- an fp16 overflow on rank 0 only: every rank skips the step, errors and Q untouched;
- a state saved mid-run and loaded into a fresh model and optimizer continues as the run itself did, with
  a learning rate set after the load (as the trainer's schedule sets it).
"""
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht

out_dir = Path(sys.argv[1])
ht.init()
rank, size = ht.rank(), ht.size()
res = {"rank": rank, "size": size}
BATCH, STEPS = 16, 8


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # a conv weight (4-D, seen as 8 x 9), matrices, biases
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 24), torch.nn.Tanh(), torch.nn.Linear(24, 10))


def batch(step: int, whole: bool = False):
    """This rank's part of the step's global batch (the whole of it with whole=True)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    if whole:
        return x, y
    part = BATCH // size
    return x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train(model, optimizer, steps, first=0, scaler=None, poison=None):
    applied = []
    for step in range(first, first + steps):
        x, y = batch(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if step == poison and rank == 0:
            loss = loss * float("inf")
        (scaler.scale(loss) if scaler else loss).backward()
        applied.append(ht.step(optimizer, scaler=scaler))
    return applied


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


# --- full rank equals plain averaging ----------------------------------------------------------------
plain_model, full_model = make_model(), make_model()
plain = ht.distribute(plain_model, sgd(plain_model), compression="none")
full = ht.distribute(full_model, sgd(full_model), compression="powersgd",
                     powersgd={"rank": 64, "start_step": 0, "min_compression_rate": 0})
train(plain_model, plain, STEPS)
train(full_model, full, STEPS)
res["full_rank"] = {"compressed": len(full.matrices), "moved": float((flat(plain_model) - flat(make_model())).abs().max()),
                    "max_abs_diff": float((flat(plain_model) - flat(full_model)).abs().max())}


# --- low rank against the algorithm written out, on the whole batch in one process ------------------
def reference(steps: int, r: int, start: int) -> torch.Tensor:
    model = make_model()
    opt = sgd(model)
    params = [p for p in model.parameters()]
    state = {}
    for i, p in enumerate(params):  # the matrices PowerSGD compresses here: every weight (rate 0)
        if p.dim() >= 2:
            rows, cols = p.shape[0], p.numel() // p.shape[0]
            q = torch.randn(cols, min(r, rows, cols), generator=torch.Generator().manual_seed(i))
            state[p] = {"q": q, "e": torch.zeros(rows, cols)}
    for step in range(steps):
        x, y = batch(step, whole=True)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if step >= start:
            for p, s in state.items():
                m = p.grad.reshape(s["e"].shape) + s["e"]
                p_hat, _ = torch.linalg.qr(m @ s["q"])
                s["q"] = m.t() @ p_hat
                approx = p_hat @ s["q"].t()
                s["e"] = m - approx
                p.grad.copy_(approx.reshape(p.shape))
        opt.step()
    return flat(model)


low_model = make_model()
low = ht.distribute(low_model, sgd(low_model), compression="powersgd",
                    powersgd={"rank": 2, "start_step": 3, "min_compression_rate": 0})
train(low_model, low, STEPS)
expected = reference(STEPS, 2, 3)
res["low_rank"] = {"compressed": len(low.matrices),
                   "max_abs_diff": float((flat(low_model) - expected).abs().max()),
                   "differs_from_plain": float((flat(low_model) - flat(plain_model)).abs().max())}

# --- an fp16 overflow on one rank: the step skipped everywhere, the compression state untouched ------
fp16_model = make_model()
fp16 = ht.distribute(fp16_model, sgd(fp16_model), compression="powersgd",
                     powersgd={"rank": 2, "start_step": 0, "min_compression_rate": 0})
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
train(fp16_model, fp16, 3, scaler=scaler)
before = {k: {i: t.clone() for i, t in v.items()} for k, v in fp16.compression_state(local=True).items()
          if k in ("q", "error")}
params_before = flat(fp16_model)
applied = train(fp16_model, fp16, 1, first=3, scaler=scaler, poison=3)
after = fp16.compression_state(local=True)
res["overflow"] = {"applied": applied, "params_unchanged": bool(torch.equal(params_before, flat(fp16_model))),
                   "state_unchanged": all(torch.equal(before[k][i], after[k][i]) for k in before for i in before[k]),
                   "finite_after": bool(all(torch.isfinite(t).all() for k in ("q", "error")
                                            for t in after[k].values())),
                   "applied_next": train(fp16_model, fp16, 1, first=4, scaler=scaler)}

# --- a saved state, loaded into a fresh model and optimizer, continues as the run did ------------------
run_model = make_model()
run = ht.distribute(run_model, torch.optim.Adam(run_model.parameters(), lr=0.01), compression="powersgd",
                    powersgd={"rank": 1, "start_step": 2, "min_compression_rate": 0})
train(run_model, run, 4)
saved_params = copy.deepcopy(run_model.state_dict())
saved = copy.deepcopy(run.state_dict())  # collective: the ranks' mean error (copied: Adam's moments change in place)
own_errors_differ = any(not torch.equal(m.error, saved["powersgd"]["error"][i])
                        for i, m in zip(sorted(saved["powersgd"]["error"]), run.matrices.values()))


def lower_lr(optimizer):
    """As the trainer's schedule does each step: through the wrapper's param_groups."""
    for group in optimizer.param_groups:
        group["lr"] = 0.002


lower_lr(run)
train(run_model, run, 4, first=4)
resumed_model = make_model()
resumed_model.load_state_dict(saved_params)
resumed = ht.distribute(resumed_model, torch.optim.Adam(resumed_model.parameters(), lr=0.01),
                        compression="powersgd", powersgd={"rank": 1, "start_step": 2, "min_compression_rate": 0})
resumed.load_state_dict(saved)
lower_lr(resumed)  # after the load: the step must take it (it kept the saved 0.01 once)
train(resumed_model, resumed, 4, first=4)
refused = []
for bad in ({**saved, "powersgd": {**saved["powersgd"], "rank": 3}},):
    try:
        resumed.load_state_dict(bad)
    except ValueError as e:
        refused.append(str(e))
res["resume"] = {"steps": saved["powersgd"]["steps"], "own_errors_differ_from_the_mean": own_errors_differ,
                 "max_abs_diff": float((flat(run_model) - flat(resumed_model)).abs().max()), "refused": refused}

(out_dir / f"rank{rank}.json").write_text(json.dumps(res))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
