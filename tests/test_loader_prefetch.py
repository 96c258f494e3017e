"""ShardedLoader's prefetch: the same batches in the same order as reading in the loop, a failed read
raised at its batch, no reader thread left behind, and reading overlapping the consumer's work."""
from __future__ import annotations

import gc
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hvdk8s.data.datasets import ArrayDataset, IndexSubset, MapDataset
from hvdk8s.data.shards import ShardedDataset, write_shards
from hvdk8s.data import torch as loader_module
from hvdk8s.data.torch import ShardedLoader
from hvdk8s.trainer.torch import prefetch_depth

READER = "hvdk8s-loader-prefetch"
WAIT_S = 30  # only a bound for a broken loader (a test fails rather than hangs); never a measurement


def readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == READER]


def no_reader_left() -> bool:
    for t in readers():
        t.join(timeout=1)
    return not readers()


def arrays(n: int = 53) -> ArrayDataset:
    x = np.random.default_rng(0).standard_normal((n, 3, 4), dtype=np.float32)
    return ArrayDataset(x, np.arange(n), {"input_shape": [3, 4], "num_classes": n})


class Recording:
    """A dataset that logs when each read starts and ends (and can fail, or wait, at chosen reads)."""

    def __init__(self, base, fail_at: int | None = None):
        self.base, self.fail_at, self.info = base, fail_at, base.info
        self.log: list[tuple[str, int]] = []
        self.started = [threading.Event() for _ in range(1000)]
        self.reads = 0

    def __len__(self):
        return len(self.base)

    def epoch_order(self, seed, epoch):
        return self.base.epoch_order(seed, epoch)

    def take(self, indices):
        k, self.reads = self.reads, self.reads + 1
        self.log.append(("take", k))
        self.started[k].set()
        if k == self.fail_at:
            raise OSError(f"shard gone at read {k}")
        return self.base.take(indices)


def batches(loader: ShardedLoader) -> list[tuple[np.ndarray, np.ndarray, int]]:
    return [(b.x.numpy(), b.y.numpy(), b.global_count) for b in loader]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    n = 203
    x = np.random.default_rng(1).standard_normal((n, 2, 5), dtype=np.float32)
    directory = tmp_path_factory.mktemp("shards")
    write_shards(directory, {"x": x, "y": np.arange(n)}, samples_per_shard=16, info={"num_classes": n})
    return ShardedDataset(directory)


@pytest.mark.parametrize("source", ["arrays", "shards"])
@pytest.mark.parametrize("batch_size,rank,size,shuffle,steps_multiple", [
    (8, 0, 1, True, 1), (7, 1, 3, True, 4), (64, 2, 3, False, 1), (300, 0, 2, True, 2), (1, 1, 2, True, 1)])
@pytest.mark.parametrize("prefetch", [1, 2, 5])
def test_same_batches_in_the_same_order(source, shards, batch_size, rank, size, shuffle, steps_multiple, prefetch):
    dataset = arrays() if source == "arrays" else shards
    kw = dict(rank=rank, size=size, seed=3, shuffle=shuffle, steps_multiple=steps_multiple)
    plain, ahead = ShardedLoader(dataset, batch_size, **kw), ShardedLoader(dataset, batch_size, prefetch=prefetch, **kw)
    for epoch in (1, 2):
        plain.set_epoch(epoch)
        ahead.set_epoch(epoch)
        want, got = batches(plain), batches(ahead)
        assert len(got) == len(want) == len(plain)
        for (wx, wy, wc), (bx, by, bc) in zip(want, got):
            assert bx.dtype == wx.dtype and np.array_equal(bx, wx) and np.array_equal(by, wy) and bc == wc
    assert no_reader_left()


@pytest.mark.parametrize("prefetch", [1, 3])
@pytest.mark.parametrize("fail_at", [0, 1, 4])
def test_a_failed_read_is_raised_at_its_batch_after_the_good_ones(prefetch, fail_at):
    want = batches(ShardedLoader(arrays(), 5, rank=0, size=1))
    got = []
    with pytest.raises(OSError, match=f"shard gone at read {fail_at}"):
        for b in ShardedLoader(Recording(arrays(), fail_at=fail_at), 5, rank=0, size=1, prefetch=prefetch):
            got.append((b.x.numpy(), b.y.numpy(), b.global_count))
    assert len(got) == fail_at
    assert all(np.array_equal(g[1], w[1]) for g, w in zip(got, want))
    assert no_reader_left()


def test_stopping_early_leaves_no_reader_thread():
    before = set(threading.enumerate())
    loader = ShardedLoader(arrays(200), 2, rank=0, size=1, prefetch=2)  # 100 batches: the queue fills up

    for _ in loader:  # break
        break
    assert no_reader_left()

    it = iter(loader)  # close
    next(it)
    it.close()
    assert no_reader_left()

    it = iter(loader)  # dropped mid-epoch (garbage collected)
    next(it), next(it)
    del it
    gc.collect()
    assert no_reader_left()

    with pytest.raises(RuntimeError, match="the step failed"):  # the consumer raised
        for i, _ in enumerate(loader):
            if i == 3:
                raise RuntimeError("the step failed")
    assert no_reader_left()

    for _ in loader:  # run to the end
        pass
    assert no_reader_left()
    assert set(threading.enumerate()) <= before


def test_stopping_while_a_read_is_in_progress_waits_for_it(monkeypatch):
    gate, finished = threading.Event(), threading.Event()

    class Stop(threading.Event):
        """The loader's stop signal, which also lets the blocked read go on: the read ends only after
        close() has asked the reader to stop, however slowly the consumer gets there."""

        def set(self):
            super().set()
            gate.set()

    monkeypatch.setattr(loader_module, "threading", SimpleNamespace(Event=Stop, Thread=threading.Thread,
                                                                    current_thread=threading.current_thread))

    class Slow(Recording):
        def take(self, indices):
            out = super().take(indices)
            if self.reads == 2:  # the reader blocks in the second read
                gate.wait(WAIT_S)
                finished.set()
            return out

    ds = Slow(arrays())
    it = iter(ShardedLoader(ds, 5, rank=0, size=1, prefetch=2))
    next(it)
    assert ds.started[1].wait(WAIT_S)
    it.close()
    assert finished.is_set()  # close() waited for the read in progress to end
    assert no_reader_left()
    assert ds.reads == 2  # and the reader read nothing after it


def test_reading_the_next_batch_overlaps_the_work_on_this_one():
    """While the consumer works on batch k, the read of batch k+1 starts: the consumer waits for that
    read to start before finishing k, which only a reader ahead of it can satisfy."""
    ds = Recording(arrays())
    loader = ShardedLoader(ds, 5, rank=0, size=1, prefetch=2)
    for k, _ in enumerate(loader):
        ds.log.append(("work", k))
        if k + 1 < len(loader):
            assert ds.started[k + 1].wait(WAIT_S), f"the read of batch {k + 1} never started during batch {k}"
        ds.log.append(("done", k))
    order = ds.log.index
    assert all(order(("take", k + 1)) < order(("done", k)) for k in range(len(loader) - 1))


def test_without_prefetch_reads_happen_in_the_loop():
    ds = Recording(arrays())
    loader = ShardedLoader(ds, 5, rank=0, size=1)
    for k, _ in enumerate(loader):
        ds.log.append(("done", k))
    order = ds.log.index
    assert all(order(("done", k)) < order(("take", k + 1)) for k in range(len(loader) - 1))
    assert not readers()


@pytest.mark.parametrize("prefetch", [1, 2])
def test_the_reader_stays_at_most_prefetch_batches_ahead(prefetch):
    ds = Recording(arrays())
    it = iter(ShardedLoader(ds, 5, rank=0, size=1, prefetch=prefetch))
    next(it)  # the consumer holds batch 0; the queue holds `prefetch`; one more read waits to be queued
    assert ds.started[prefetch + 1].wait(WAIT_S)
    time.sleep(0.2)  # room for a runaway reader to go further: not a measurement
    assert ds.reads == prefetch + 2
    it.close()
    assert no_reader_left()


def test_the_trainer_reads_ahead_on_a_gpu_from_data_that_draws_no_global_random_numbers(shards):
    class Images:  # a user's map-style dataset: its reads may run random augmentation
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.zeros(3, np.float32), 0

    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert prefetch_depth(arrays(), gpu) == 2
    assert prefetch_depth(shards, gpu) == 2
    assert prefetch_depth(IndexSubset(arrays(), np.arange(3)), gpu) == 2
    assert prefetch_depth(MapDataset(Images()), gpu) == 0
    assert prefetch_depth(IndexSubset(MapDataset(Images()), np.arange(3)), gpu) == 0
    assert prefetch_depth(arrays(), cpu) == prefetch_depth(shards, cpu) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_batches_are_the_same_pinned_and_copied_asynchronously():
    kw = dict(rank=0, size=1, seed=3, device="cuda")
    want = batches_on_cpu(ShardedLoader(arrays(), 7, **kw))
    got = batches_on_cpu(ShardedLoader(arrays(), 7, prefetch=2, **kw))
    assert len(got) == len(want)
    assert all(np.array_equal(a, b) for w, g in zip(want, got) for a, b in zip(w, g))


def batches_on_cpu(loader):
    out = []
    for b in loader:
        assert b.x.is_cuda and b.y.is_cuda
        out.append((b.x.cpu().numpy(), b.y.cpu().numpy()))
    return out
