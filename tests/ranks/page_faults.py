"""Minor page faults of one training step (batch 32, one thread), printed as a number: run by
tests/test_malloc_tuning.py with and without hvdk8s's malloc settings.

    python page_faults.py [resnet8 | wide]

resnet8 (the default): activations of a few MB. wide: one 3072 -> 4096 layer, a weight and gradient of
50 MB, over glibc's largest mmap threshold of its own (32 MB)."""
import resource
import sys

import torch
import torch.nn.functional as F

from hvdk8s.models import build

torch.set_num_threads(1)
torch.manual_seed(0)
wide = sys.argv[1:] == ["wide"]
model = (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3072, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))
         if wide else build("resnet", "pytorch", {"depth": 8}, input_shape=[3, 32, 32], num_classes=10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


def step():
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


for _ in range(3):  # the heap grows to a step's peak
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
