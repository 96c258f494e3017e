"""The PyTorch training loop behind `hvdk8s train` (framework: pytorch)."""
from __future__ import annotations

import time
from typing import Any

from hvdk8s.spec import JobSpec
from hvdk8s.train import lr_scale, parameter_digest, warmup_lr


def _make_optimizer(t, params, lr: float):
    import torch

    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=t.weight_decay)


def _loss_fn(task: str):
    """Per-task (sum of per-sample losses, correct predictions, predictions counted)."""
    import torch.nn.functional as F

    if task == "language_model":
        def lm(logits, y):
            tokens = y.shape[1]
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / tokens
            return loss, (logits.argmax(-1) == y).sum(), y.numel()
        return lm

    def classify(logits, y):
        return F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(-1) == y).sum(), y.numel()
    return classify


def run(spec: JobSpec, *, resume: bool = True) -> dict[str, Any]:
    import torch

    import hvdk8s.torch as ht
    from hvdk8s.data.datasets import open_splits
    from hvdk8s.data.torch import ShardedLoader
    from hvdk8s.events import Reporter
    from hvdk8s.models import registry

    t = spec.training
    ht.init()
    rank, size = ht.rank(), ht.size()
    report = Reporter(enabled=rank == 0)
    dev = ht.device()
    torch.manual_seed(t.seed)

    splits = open_splits(spec.dataset)
    entry = registry.get(spec.model.name)
    model = entry.build("pytorch", spec.model.args, **splits["train"].info).to(dev)
    k = t.backward_passes_per_step
    peak_lr = t.learning_rate * lr_scale(t.lr_scaling, size, k)
    optimizer = _make_optimizer(t, model.parameters(), peak_lr)

    start_epoch = 1
    if t.checkpoint.dir and resume:
        done_epoch, extra = ht.load_checkpoint(t.checkpoint.dir, model, optimizer)
        start_epoch = done_epoch + 1
    optimizer = ht.distribute(model, optimizer, compression=t.compression, backward_passes_per_step=k)
    if start_epoch > 1:
        report.emit("resume", epoch=start_epoch - 1, path=extra["path"],
                    digest=parameter_digest(model.state_dict()))

    train_loader = ShardedLoader(splits["train"], t.batch_size, rank=rank, size=size, seed=t.seed,
                                 steps_multiple=k, device=dev)
    test_loader = ShardedLoader(splits["test"], max(256, t.batch_size), rank=rank, size=size, shuffle=False,
                                device=dev)
    global_counts = train_loader.global_counts
    steps = len(global_counts)
    opt_steps_per_epoch = steps // k
    warmup_steps = round(t.warmup_epochs * opt_steps_per_epoch)
    loss_fn = _loss_fn(entry.task)
    report.emit("start", job=spec.name, framework=spec.framework, model=spec.model.name,
                dataset=spec.dataset.name or spec.dataset.path, ranks=size,
                compression=ht.resolve_compression(t.compression), lr=peak_lr, steps_per_epoch=steps,
                epochs=t.epochs, start_epoch=start_epoch)

    began = time.perf_counter()
    test_acc = float("nan")
    for epoch in range(start_epoch, t.epochs + 1):
        train_loader.set_epoch(epoch)
        model.train()
        sums = torch.zeros(4, dtype=torch.float64)  # loss, correct, counted, samples
        epoch_start = last_report = time.perf_counter()
        for i, batch in enumerate(train_loader):
            if i % k == 0:
                group_total = int(global_counts[i:i + k].sum())
                lr = warmup_lr((epoch - 1) * opt_steps_per_epoch + i // k, warmup_steps, t.learning_rate, peak_lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
            if len(batch.x):
                loss_sum, correct, counted = loss_fn(model(batch.x), batch.y)
                sums += torch.tensor([loss_sum.item(), correct.item(), counted, len(batch.x)],
                                     dtype=torch.float64)
            else:  # this rank's part ran out: join the allreduce with zero gradients
                loss_sum = sum(p.sum() for p in model.parameters()) * 0.0
            # Weighted so that Horovod's average over ranks is the mean over the samples read.
            (loss_sum * (size / group_total)).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()
            now = time.perf_counter()
            if rank == 0 and now - last_report >= 1.0 and i + 1 < steps:
                report.emit("progress", epoch=epoch, step=i + 1, steps=steps,
                            loss=float(sums[0] / max(float(sums[3]), 1.0)),
                            samples_per_s=float(global_counts[:i + 1].sum()) / (now - epoch_start))
                last_report = now
        seconds = time.perf_counter() - epoch_start
        loss_sum, correct, counted, samples = ht.allreduce(sums, ht.Sum, name="hvdk8s.train_metrics").tolist()
        test_loss, test_acc = _evaluate(model, test_loader, loss_fn, ht)
        report.emit("epoch", epoch=epoch, epochs=t.epochs, loss=loss_sum / samples, accuracy=correct / counted,
                    test_loss=test_loss, test_accuracy=test_acc, samples_per_s=samples / seconds, seconds=seconds)
        if t.checkpoint.dir and (epoch % t.checkpoint.interval_epochs == 0 or epoch == t.epochs):
            path = ht.save_checkpoint(t.checkpoint.dir, epoch, model, optimizer, extra={"job": spec.name},
                                      keep=t.checkpoint.keep)
            if path is not None:
                report.emit("checkpoint", epoch=epoch, path=str(path))

    if start_epoch > t.epochs:  # nothing left to train: report the restored model
        test_loss, test_acc = _evaluate(model, test_loader, loss_fn, ht)
    summary = {"test_accuracy": test_acc, "epochs": t.epochs, "seconds": time.perf_counter() - began,
               "digest": parameter_digest(model.state_dict())}
    report.emit("done", **summary)
    return summary


def _evaluate(model, loader, loss_fn, ht) -> tuple[float, float]:
    import torch

    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # loss, correct, counted, samples
    with torch.no_grad():
        for batch in loader:
            if len(batch.x):
                loss_sum, correct, counted = loss_fn(model(batch.x), batch.y)
                sums += torch.tensor([loss_sum.item(), correct.item(), counted, len(batch.x)], dtype=torch.float64)
    loss_sum, correct, counted, samples = ht.allreduce(sums, ht.Sum, name="hvdk8s.test_metrics").tolist()
    return loss_sum / max(samples, 1), correct / max(counted, 1)
