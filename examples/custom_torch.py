"""Your own training script with hvdk8s's Horovod wrapper, models and loaders.

    horovodrun -np 2 -H localhost:2 python examples/custom_torch.py [CHECKPOINT_DIR] [EPOCHS]
"""
import sys

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s.data.datasets import digits, train_test_split
from hvdk8s.data.torch import ShardedLoader
from hvdk8s.models import build

ckpt_dir = sys.argv[1] if len(sys.argv) > 1 else "checkpoints/custom"
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 10

ht.init()  # CPU: cores / local ranks threads each; GPU: the device of the local rank
torch.manual_seed(0)
model = build("cnn", "pytorch", {"channels": [16, 32]}, input_shape=[1, 8, 8], num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * ht.size(), momentum=0.9)
start, _ = ht.load_checkpoint(ckpt_dir, model, optimizer)  # rank 0 reads; (0, {}) on a first run
optimizer = ht.distribute(model, optimizer)  # rank 0's state everywhere; averaged gradients

train, test = train_test_split(digits(), 0.2)
loader = ShardedLoader(train, 32, rank=ht.rank(), size=ht.size(), seed=0)
for epoch in range(start + 1, epochs + 1):
    loader.set_epoch(epoch)  # a new order every epoch, the same for the same seed
    model.train()
    for x, y, global_count in loader:
        optimizer.zero_grad()
        # Sum over this rank's samples, scaled so Horovod's average is the mean over the global batch.
        loss = F.cross_entropy(model(x), y, reduction="sum") * ht.size() / global_count
        loss.backward()
        optimizer.step()
    ht.save_checkpoint(ckpt_dir, epoch, model, optimizer)  # rank 0 only, atomic

model.eval()
with torch.no_grad():
    test_loader = ShardedLoader(test, 256, rank=ht.rank(), size=ht.size(), shuffle=False)
    correct = sum(int((model(x).argmax(1) == y).sum()) for x, y, _ in test_loader)
accuracy = ht.metric_sum(correct) / len(test)
ht.log(f"test accuracy {accuracy:.2%}")  # printed by rank 0 only
