"""The PyTorch part of `hvdk8s train`: steps of one epoch, evaluation and checkpoint I/O; the loop
itself is `hvdk8s.trainer.job.run_epochs`."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s.data.torch import ShardedLoader
from hvdk8s.spec import JobSpec

from .job import EpochStats, LRSchedule, Progress, build_model, parameter_digest


def make_optimizer(t, params, lr: float) -> torch.optim.Optimizer:
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=t.weight_decay)


def loss_fn(task: str):
    """Per-task (sum of per-sample losses, correct predictions, predictions counted)."""
    if task == "language_model":
        def lm(logits, y):
            logits = logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / y.shape[1]
            return loss, (logits.argmax(-1) == y).sum(), y.numel()
        return lm

    def classify(logits, y):
        logits = logits.float()  # autocast may leave logits in bf16/fp16: sum the loss in fp32
        return F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(-1) == y).sum(), y.numel()
    return classify


class TorchSteps:
    def __init__(self, spec: JobSpec, splits: dict[str, Any]):
        t = self.training = spec.training
        ht.init()
        self.rank, self.size = ht.rank(), ht.size()
        dev = ht.device()
        torch.manual_seed(t.seed)
        self.model = build_model(spec, splits["train"].info).to(dev)
        self.k = t.backward_passes_per_step
        self.train_loader = ShardedLoader(splits["train"], t.batch_size, rank=self.rank, size=self.size,
                                          seed=t.seed, steps_multiple=self.k, device=dev)
        self.test_loader = ShardedLoader(splits["test"], max(256, t.batch_size), rank=self.rank, size=self.size,
                                         shuffle=False, device=dev)
        self.global_counts = self.train_loader.global_counts
        self.steps_per_epoch = len(self.global_counts)
        self.lr = LRSchedule.for_job(t, self.size, self.steps_per_epoch // self.k)
        self.optimizer = make_optimizer(t, self.model.parameters(), self.lr.peak)
        self.loss = loss_fn(spec.model.resolved_task)
        self.scaler = ht.grad_scaler(t.precision)
        self.compression = ht.resolve_compression(t.compression)
        self.distributed = False

    def _distribute(self) -> None:
        """Wrap the optimizer once, after any resume (distribute broadcasts rank 0's restored state)."""
        if not self.distributed:
            self.optimizer = ht.distribute(self.model, self.optimizer, compression=self.training.compression,
                                           backward_passes_per_step=self.k)
            self.distributed = True

    def load(self, directory: str) -> tuple[int, dict]:
        found = ht.load_checkpoint(directory, self.model, self.optimizer)
        self._distribute()
        return found

    def train_epoch(self, epoch: int, progress: Progress) -> EpochStats:
        self._distribute()
        t, k, model, optimizer = self.training, self.k, self.model, self.optimizer
        self.train_loader.set_epoch(epoch)
        model.train()
        # Running sums stay on the device; read once per report and once per epoch (a host sync).
        sums = torch.zeros(4, dtype=torch.float64, device=ht.device())  # loss, correct, counted, samples
        opt_steps = (epoch - 1) * (self.steps_per_epoch // k)
        done = 0
        for i, batch in enumerate(self.train_loader):
            if i % k == 0:
                group_total = int(self.global_counts[i:i + k].sum())
                for group in optimizer.param_groups:
                    group["lr"] = self.lr.at(opt_steps + i // k)
            with ht.autocast(t.precision):
                if len(batch.x):
                    loss_sum, correct, counted = self.loss(model(batch.x), batch.y)
                    sums += torch.stack([loss_sum.detach().double(), correct.double(),
                                         torch.tensor(float(counted), dtype=torch.float64, device=sums.device),
                                         torch.tensor(float(len(batch.x)), dtype=torch.float64, device=sums.device)])
                else:  # this rank's part ran out: join the allreduce with zero gradients
                    loss_sum = sum(p.sum() for p in model.parameters()) * 0.0
            # Weighted so that Horovod's average over ranks is the mean over the samples read.
            loss = loss_sum * (self.size / group_total)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            if (i + 1) % k == 0:
                ht.step(optimizer, scaler=self.scaler, clip_grad_norm=t.clip_grad_norm)
                optimizer.zero_grad()
            done += batch.global_count
            progress.step(i + 1, done, lambda: float(sums[0] / max(float(sums[3]), 1.0)))
        loss_sum, correct, counted, samples = ht.allreduce(sums.cpu(), ht.Sum, name="hvdk8s.train_metrics").tolist()
        return EpochStats(loss_sum / max(samples, 1), correct / max(counted, 1), int(samples))

    def evaluate(self) -> tuple[float, float]:
        self.model.eval()
        sums = torch.zeros(4, dtype=torch.float64)  # loss, correct, counted, samples
        with torch.no_grad(), ht.autocast(self.training.precision):
            for batch in self.test_loader:
                if len(batch.x):
                    loss_sum, correct, counted = self.loss(self.model(batch.x), batch.y)
                    sums += torch.tensor([float(loss_sum), float(correct), counted, len(batch.x)],
                                         dtype=torch.float64)
        loss_sum, correct, counted, samples = ht.allreduce(sums, ht.Sum, name="hvdk8s.test_metrics").tolist()
        return loss_sum / max(samples, 1), correct / max(counted, 1)

    def save(self, directory: str, epoch: int, keep: int, extra: dict) -> Optional[str]:
        return ht.save_checkpoint(directory, epoch, self.model, self.optimizer, extra=extra, keep=keep)

    def digest(self) -> str:
        return parameter_digest(self.model.state_dict())

    def loss_scale(self) -> Optional[float]:
        return None if self.scaler is None else float(self.scaler.get_scale())
