"""Which samples each rank reads: exactly once per epoch, balanced, reshuffled per epoch, reproducible."""
import numpy as np
import pytest

from hvdk8s.data.datasets import ArrayDataset, digits, open_splits, synthetic_tokens, train_test_split
from hvdk8s.data.catalog import SyntheticTokensArgs
from hvdk8s.data.rankplans import part_bounds, plan_epoch
from hvdk8s.data.shards import ShardedDataset, ShardFormatError, write_shards
from hvdk8s.spec import DatasetSpec


def read_all(dataset, ranks, batch, seed, epoch, multiple=1):
    plans = [plan_epoch(dataset.epoch_order(seed, epoch), r, ranks, batch, multiple) for r in range(ranks)]
    per_rank = [[int(i) for b in p.batches() for i in dataset.take(b)[1]] for p in plans]
    return plans, per_rank


@pytest.mark.parametrize("n,ranks,batch", [(1797, 2, 32), (103, 4, 7), (5, 8, 2), (64, 2, 32), (1, 3, 1)])
def test_each_sample_once_per_epoch_and_steps_agree(n, ranks, batch):
    ds = ArrayDataset(np.zeros((n, 1), np.float32), np.arange(n))
    plans, per_rank = read_all(ds, ranks, batch, seed=3, epoch=1)
    assert sorted(sum(per_rank, [])) == list(range(n))
    assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1
    assert len({p.steps for p in plans}) == 1
    # global counts say how many samples all ranks read at each step
    counted = np.sum([[len(b) for b in p.batches()] for p in plans], axis=0)
    assert (counted == plans[0].global_counts).all()


def test_steps_round_up_to_whole_accumulation_groups():
    ds = ArrayDataset(np.zeros((50, 1)), np.arange(50))
    plans, per_rank = read_all(ds, 2, 4, seed=0, epoch=1, multiple=3)
    assert plans[0].steps % 3 == 0 and plans[0].steps == 9  # 7 needed, padded with empty batches
    assert sorted(sum(per_rank, [])) == list(range(50))


def test_order_changes_between_epochs_and_repeats_for_a_seed():
    ds = ArrayDataset(np.zeros((100, 1)), np.arange(100))
    assert (ds.epoch_order(1, 1) != ds.epoch_order(1, 2)).any()
    assert (ds.epoch_order(1, 1) == ds.epoch_order(1, 1)).all()
    assert (ds.epoch_order(1, 1) != ds.epoch_order(2, 1)).any()


def test_part_bounds_cover_without_overlap():
    bounds = [part_bounds(10, r, 3) for r in range(3)]
    assert bounds == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError):
        part_bounds(10, 3, 3)


def test_shard_format_streams_disjoint_parts(tmp_path):
    ids = np.arange(95)
    write_shards(tmp_path, {"x": ids[:, None].astype(np.float32), "y": ids}, samples_per_shard=10,
                 info={"input_shape": [1], "num_classes": 95})
    ds = ShardedDataset(tmp_path, verify=True)
    assert len(ds) == 95 and ds.info["num_classes"] == 95
    for epoch in (1, 2):
        plans, per_rank = read_all(ds, 3, 8, seed=9, epoch=epoch)
        assert sorted(sum(per_rank, [])) == list(range(95))
    # Shard-sequential, neighbours mixed in pairs: each pair's samples are contiguous in the order and
    # come from exactly two shards; any batch up to a shard's size touches at most four shards (what a
    # reader keeps in memory), yet batches do mix shards.
    order = ds.epoch_order(9, 1)
    sizes = {s: 10 for s in range(9)} | {9: 5}
    pairs, current, left = [], set(), 0
    for shard in order // 10:  # walk the order: a third shard may only start once a pair is used up
        if shard not in current:
            assert len(current) < 2, "a third shard began before the pair was read"
            current.add(shard)
            left += sizes[shard]
        left -= 1
        if left == 0:
            pairs.append(current)
            current = set()
    assert [len(p) for p in pairs] == [2] * 5
    assert max(len(set(order[i:i + 10] // 10)) for i in range(len(order) - 10)) <= 4
    assert sum(len(set(order[i:i + 8] // 10)) > 1 for i in range(0, len(order), 8)) >= len(order) // 8 // 2
    _, again = read_all(ds, 3, 8, seed=9, epoch=1)
    assert again == read_all(ds, 3, 8, seed=9, epoch=1)[1]


def test_shard_errors_name_the_file(tmp_path):
    with pytest.raises(ShardFormatError, match="index.json: no shard index"):
        ShardedDataset(tmp_path)
    ids = np.arange(20)
    write_shards(tmp_path, {"x": ids[:, None], "y": ids}, samples_per_shard=10, info={})
    (tmp_path / "shard-00001.npz").write_bytes(b"garbage")
    with pytest.raises(ShardFormatError, match="shard-00001.npz: checksum"):
        ShardedDataset(tmp_path, verify=True)
    with pytest.raises(ShardFormatError, match="shard-00001.npz: cannot read"):
        ShardedDataset(tmp_path).take(np.array([15]))


def test_digits_is_the_real_dataset_split_reproducibly():
    ds = digits()
    assert ds.x.shape == (1797, 1, 8, 8) and ds.x.dtype == np.float32
    assert ds.x.min() == 0.0 and ds.x.max() == 1.0 and set(ds.y.tolist()) == set(range(10))
    train, test = train_test_split(ds, 0.2)
    assert (len(train), len(test)) == (1438, 359)
    splits = open_splits(DatasetSpec(name="digits"))
    assert (splits["test"].y == test.y).all()


def test_synthetic_tokens_are_next_token_targets():
    ds = synthetic_tokens(SyntheticTokensArgs(samples=16, seq_len=12, vocab_size=30))
    assert ds.x.shape == (16, 12) and (ds.x[:, 1:] == ds.y[:, :-1]).all()
    assert ds.x.max() < 30


def test_digits_are_scikit_learns_own_without_importing_it():
    """hvdk8s reads the digits file scikit-learn ships (its import costs each rank ~2 s): same arrays."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; from hvdk8s.data.datasets import digits; d = digits(); "
            "assert 'sklearn' not in sys.modules; from sklearn.datasets import load_digits; b = load_digits(); "
            "assert d.x.dtype == np.float32 and d.y.dtype == np.int64; "
            "assert np.array_equal(d.x, (b.images.astype(np.float32) / 16.0)[:, None]); "
            "assert np.array_equal(d.y, b.target); print(len(d))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "1797", run.stderr
