"""The hand-written Horovod loop the trainer is measured against: what a user writes from Horovod's
PyTorch example (DistributedSampler, DataLoader, DistributedOptimizer), over the same model, data,
batch, optimizer and learning rate as the trainer's job. Rank 0 writes the global training samples/s of
each epoch.

    python -m hvdk8s.bench.handwritten_rank '{"job": JOB_YAML, "out": PATH}'
"""
from __future__ import annotations

import json
import os
import sys
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hvdk8s.data.datasets import open_splits
from hvdk8s.models import build
from hvdk8s.spec import load_job


def main(config: dict) -> None:
    spec = load_job(config["job"])
    t = spec.training
    hvd.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    train = open_splits(spec.dataset)["train"]
    data = TensorDataset(torch.from_numpy(train.x), torch.from_numpy(train.y))
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=t.seed)
    loader = DataLoader(data, batch_size=t.batch_size, sampler=sampler)
    torch.manual_seed(t.seed)
    model = build(spec.model.name, "pytorch", spec.model.args, **train.info)
    optimizer = torch.optim.SGD(model.parameters(), lr=t.learning_rate * hvd.size(), momentum=t.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    rates = []
    for epoch in range(t.epochs):
        sampler.set_epoch(epoch)
        model.train()
        began, samples = time.perf_counter(), 0
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            samples += len(x)
        samples = hvd.allreduce(torch.tensor(float(samples)), op=hvd.Sum, name="samples").item()
        rates.append(samples / (time.perf_counter() - began))
    if hvd.rank() == 0:
        with open(config["out"], "w") as f:
            json.dump({"samples_per_s": rates}, f)


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
