"""Your own training script as an hvdk8s job: your model, your map-style dataset, your loop.

`hvdk8s launch --local -np 2 job.yaml` starts it on 2 ranks; `hvdk8s render job.yaml` carries it to a
cluster in the job's ConfigMap. The job file's settings (epochs, batch size, learning rate, precision,
clipping, checkpoints) reach the script through `hvdk8s.job()`, so the two never disagree.

    python train.py [--hidden N]       # arguments come from the job file's entrypoint.args
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvdk8s
import hvdk8s.torch as ht
from hvdk8s.data.datasets import as_dataset, split
from hvdk8s.data.torch import ShardedLoader


class Digits(torch.utils.data.Dataset):
    """A map-style dataset like torchvision's: len() and [i] -> (image tensor, label)."""

    def __init__(self):
        bunch = load_digits()
        self.images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0)
        self.targets = bunch.target.tolist()
        self.classes = list(range(10))

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.images[i].flatten(), self.targets[i]


class Net(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def forward(self, x):
        return self.body(x)


parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=64)
args = parser.parse_args()

job = hvdk8s.job()  # the validated job file, defaults filled in
t = job.training
ht.init()
torch.manual_seed(t.seed)
model = Net(args.hidden)
optimizer = torch.optim.SGD(model.parameters(), lr=ht.scaled_learning_rate(t.learning_rate, t.lr_scaling),
                            momentum=t.momentum)
start = 0
if t.checkpoint.dir:
    start, extra = ht.load_checkpoint(t.checkpoint.dir, model, optimizer)  # (0, {}) on a first run
    if start:
        ht.log(f"resumed from {extra['path']} at epoch {start}")
optimizer = ht.distribute(model, optimizer, compression=t.compression)
scaler = ht.grad_scaler(t.precision)  # fp16 only

train, test = split(as_dataset(Digits()), 0.2)  # any map-style dataset works with the sharded loaders
loader = ShardedLoader(train, t.batch_size, rank=ht.rank(), size=ht.size(), seed=t.seed)
for epoch in range(start + 1, t.epochs + 1):
    loader.set_epoch(epoch)
    model.train()
    for x, y, global_count in loader:
        optimizer.zero_grad()
        with ht.autocast(t.precision):
            # Summed over this rank's samples, scaled so Horovod's average is the global batch mean.
            loss = F.cross_entropy(model(x).float(), y, reduction="sum") * ht.size() / global_count
        (scaler.scale(loss) if scaler else loss).backward()
        ht.step(optimizer, scaler=scaler, clip_grad_norm=t.clip_grad_norm)
    if t.checkpoint.dir and epoch % t.checkpoint.interval_epochs == 0:
        ht.save_checkpoint(t.checkpoint.dir, epoch, model, optimizer, extra={"hidden": args.hidden},
                           keep=t.checkpoint.keep)

model.eval()
with torch.no_grad():
    test_loader = ShardedLoader(test, 256, rank=ht.rank(), size=ht.size(), shuffle=False)
    correct = sum(int((model(x).argmax(1) == y).sum()) for x, y, _ in test_loader)
ht.log(f"test accuracy {ht.metric_sum(correct) / len(test):.2%} after {t.epochs} epochs")
