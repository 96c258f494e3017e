"""The PyTorch part of `hvdk8s train`: steps of one epoch, evaluation and checkpoint I/O; the loop
itself is `hvdk8s.trainer.job.run_epochs`."""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

import hvdk8s.torch as ht
from hvdk8s.data.datasets import ArrayDataset, IndexSubset
from hvdk8s.data.rankplans import unread_after
from hvdk8s.data.shards import ShardedDataset
from hvdk8s.data.torch import ShardedLoader
from hvdk8s.spec import JobSpec


from .job import EpochStats, LRSchedule, Progress, build_model, parameter_digest, powersgd_settings


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


def prefetch_depth(dataset, device: torch.device) -> int:
    """Batches to read ahead on a background thread. 2 on a GPU, where the host waits while the GPU
    computes and pinned memory makes the copies asynchronous. 0 on the CPU, where the step keeps the
    rank's cores busy and a reader thread only competes with it (digits: epochs about 7% slower). 0 too
    for a user's map-style dataset, whose reads may draw from torch's or NumPy's global RNG (random
    augmentation): on another thread those draws would interleave with the step's, and runs would stop
    being reproducible."""
    while isinstance(dataset, IndexSubset):
        dataset = dataset.base
    return 2 if device.type == "cuda" and isinstance(dataset, (ArrayDataset, ShardedDataset)) else 0


class Sums:
    """Running loss and correct-prediction sums, kept on the device so that adding to them never waits
    for it; the counts are known on the host. Reading the sums is a host sync: once per progress report
    and once at the end."""

    def __init__(self, device: torch.device):
        self.on_device = torch.zeros(2, dtype=torch.float64, device=device)  # loss, correct
        self.counted = self.samples = 0

    def add(self, loss_sum: torch.Tensor, correct: torch.Tensor, counted: int, samples: int) -> None:
        self.on_device += torch.stack([loss_sum.detach().double(), correct.double()])
        self.counted += counted
        self.samples += samples

    def mean_loss(self) -> float:
        return float(self.on_device[0]) / max(self.samples, 1)

    def accuracy(self) -> float:
        return float(self.on_device[1]) / max(self.counted, 1)

    def allreduce(self, name: str) -> list[float]:
        """[loss, correct, counted, samples] summed over ranks."""
        loss, correct = self.on_device.tolist()
        return ht.allreduce(torch.tensor([loss, correct, self.counted, self.samples], dtype=torch.float64),
                            ht.Sum, name=name).tolist()


class TorchSteps:
    def __init__(self, spec: JobSpec, splits: dict[str, Any]):
        t = self.training = spec.training
        ht.init()
        self.rank, self.size = ht.rank(), ht.size()
        self.metrics = ht.metrics(job=spec)
        dev = ht.device()
        torch.manual_seed(t.seed)
        self.model = build_model(spec, splits["train"].info).to(dev)
        self.k = t.backward_passes_per_step
        self.splits = splits
        self._plan_ranks()
        self.optimizer = make_optimizer(t, self.model.parameters(), self.lr.peak)
        self.loss = loss_fn(spec.model.resolved_task)
        self.scaler = ht.grad_scaler(t.precision)
        self.compression = ht.resolve_compression(t.compression)
        self.distributed = False
        if t.elastic is not None:  # wrapped now, without a broadcast: the elastic state's sync is the one
            self.optimizer = ht.distribute(self.model, self.optimizer, compression=t.compression,
                                           backward_passes_per_step=self.k, broadcast=False,
                                           shard_optimizer_state=t.shard_optimizer_state, powersgd=powersgd_settings(t))
            self.distributed = True

    def _plan_ranks(self) -> None:
        """Loaders and learning rate for this rank and the number of ranks (again after an elastic change)."""
        t, dev, splits = self.training, ht.device(), self.splits
        self.train_loader = ShardedLoader(splits["train"], t.batch_size, rank=self.rank, size=self.size,
                                          seed=t.seed, steps_multiple=self.k, device=dev,
                                          prefetch=prefetch_depth(splits["train"], dev))
        self.test_loader = ShardedLoader(splits["test"], max(256, t.batch_size), rank=self.rank, size=self.size,
                                         shuffle=False, device=dev, prefetch=prefetch_depth(splits["test"], dev))
        self.steps_per_epoch = len(self.train_loader.global_counts)
        self.lr = LRSchedule.for_job(t, self.size, self.steps_per_epoch // self.k)

    def reshard(self) -> None:
        self.rank, self.size = ht.rank(), ht.size()
        if ht.device().type == "cpu":  # this node's cores, shared by the ranks it has now
            ht.share_cores()
        self._plan_ranks()

    def elastic_state(self, **attrs: Any) -> ht.ElasticState:
        return ht.ElasticState(self.model, self.optimizer, **attrs)

    def run_elastic(self, func):
        return ht.run_elastic(func)

    def _distribute(self) -> None:
        """Wrap the optimizer once, after any resume (distribute broadcasts rank 0's restored state)."""
        if not self.distributed:
            self.optimizer = ht.distribute(self.model, self.optimizer, compression=self.training.compression,
                                           backward_passes_per_step=self.k,
                                           shard_optimizer_state=self.training.shard_optimizer_state,
                                           powersgd=powersgd_settings(self.training))
            self.distributed = True

    def load(self, directory: str, broadcast: bool = True) -> tuple[int, dict]:
        if self.training.compression == "powersgd":
            # Its part of a checkpoint (Q matrices, the ranks' mean error) loads only into its own optimizer.
            self._distribute()
        found = ht.load_checkpoint(directory, self.model, self.optimizer, broadcast=broadcast)
        self._distribute()
        return found

    def train_epoch(self, epoch: int, progress: Progress, order: Optional[np.ndarray] = None,
                    commit: Optional[Callable[[np.ndarray], None]] = None) -> EpochStats:
        """One epoch, or (elastic) what is left of it: `order`. `commit(unread)` is called every
        training.elastic.commit_every_steps optimizer steps with the part of the order still unread."""
        self._distribute()
        t, k, model, optimizer = self.training, self.k, self.model, self.optimizer
        self.train_loader.set_epoch(epoch, order)
        counts = self.train_loader.global_counts
        model.train()
        sums = Sums(ht.device())
        per_epoch = self.steps_per_epoch // k
        read = 0 if order is None else len(self.train_loader.dataset) - len(order)  # before a change of ranks
        opt_steps = (epoch - 1) * per_epoch + round(read / len(self.train_loader.dataset) * per_epoch)
        every = t.elastic.commit_every_steps * k if commit is not None else 0
        done = 0
        metrics = self.metrics
        metrics.begin_epoch(epoch)
        for i, batch in enumerate(metrics.timed(self.train_loader)):
            if i % k == 0:
                group_total = int(counts[i:i + k].sum())
                for group in optimizer.param_groups:
                    group["lr"] = self.lr.at(opt_steps + i // k)
            with ht.autocast(t.precision):
                if len(batch.x):
                    loss_sum, correct, counted = self.loss(model(batch.x), batch.y)
                    sums.add(loss_sum, correct, counted, len(batch.x))
                else:  # this rank's part ran out: join the allreduce with zero gradients
                    loss_sum = sum(p.sum() for p in model.parameters()) * 0.0
            # Weighted so that Horovod's average over ranks is the mean over the samples read.
            loss = loss_sum * (self.size / group_total)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            if (i + 1) % k == 0:
                ht.step(optimizer, scaler=self.scaler, clip_grad_norm=t.clip_grad_norm)
                optimizer.zero_grad()
                if every and (i + 1) % every == 0 and i + 1 < len(counts):
                    commit(unread_after(self.train_loader.epoch_order(), self.size, t.batch_size, i + 1))
            done += batch.global_count
            metrics.step(len(batch.x), loss=sums.mean_loss, accuracy=sums.accuracy)
            progress.step(i + 1, done, sums.mean_loss)
        metrics.end_epoch()  # before the collective below (see Metrics.linger)
        loss_sum, correct, counted, samples = sums.allreduce("hvdk8s.train_metrics")
        return EpochStats(loss_sum / max(samples, 1), correct / max(counted, 1), int(samples))

    def evaluate(self) -> tuple[float, float]:
        self.model.eval()
        sums = Sums(ht.device())
        with torch.no_grad(), ht.autocast(self.training.precision):
            for batch in self.test_loader:
                if len(batch.x):
                    sums.add(*self.loss(self.model(batch.x), batch.y), len(batch.x))
        loss_sum, correct, counted, samples = sums.allreduce("hvdk8s.test_metrics")
        return loss_sum / max(samples, 1), correct / max(counted, 1)

    def save(self, directory: str, epoch: int, keep: int, extra: dict) -> Optional[str]:
        return ht.save_checkpoint(directory, epoch, self.model, self.optimizer, extra=extra, keep=keep)

    def digest(self) -> str:
        return parameter_digest(self.model.state_dict())

    def loss_scale(self) -> Optional[float]:
        return None if self.scaler is None else float(self.scaler.get_scale())

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
