"""One rank of the allreduce-defaults benchmark: times training steps of a synthetic model.

argv: OUT_JSON COMPRESSION STEPS. Prints nothing; rank 0 writes {"seconds_per_step": ...}."""
import json
import sys
import time

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s.models import build

out, compression, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ht.init()
torch.manual_seed(0)
# ~4.3M parameters: large enough that the allreduce matters, small enough for 2 CPU cores.
model = build("mlp", "pytorch", {"hidden": [1024, 1024, 1024]}, input_shape=[3, 32, 32], num_classes=10)
opt = ht.distribute(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), compression=compression)
x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


def step():
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(3):  # warm-up: allocations, Horovod's response cache
    step()
ht.allreduce(torch.zeros(1), name="bench.barrier")
start = time.perf_counter()
for _ in range(steps):
    step()
elapsed = ht.metric_average(time.perf_counter() - start, name="bench.elapsed")
if ht.rank() == 0:
    with open(out, "w") as f:
        json.dump({"seconds_per_step": elapsed / steps, "compression": ht.resolve_compression(compression)}, f)
