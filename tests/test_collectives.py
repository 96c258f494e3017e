"""Two real Horovod ranks (horovodrun, MPI controller): collectives, broadcast, equivalence, sharding."""
import numpy as np
import pytest

from conftest import rank_results, run_ranks
from hvdk8s.data.shards import write_shards

pytestmark = pytest.mark.ranks

N_SAMPLES = 103  # odd on purpose: the parts differ by one sample


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    shards = tmp_path_factory.mktemp("shards")
    ids = np.arange(N_SAMPLES)
    write_shards(shards, {"x": ids.astype(np.float32)[:, None], "y": ids}, samples_per_shard=10,
                 info={"input_shape": [1], "num_classes": N_SAMPLES})
    run_ranks("collectives.py", out, shards)
    return rank_results(out)


def test_every_rank_ran_with_one_thread_on_this_machine(results):
    import os

    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    assert all(r["threads"] == max(1, (os.cpu_count() or 1) // 2) for r in results)


def test_allreduce_averages_and_sums(results):
    # rank r holds [0,1,2,3] + 10r
    for r in results:
        assert r["allreduce_average"] == [5.0, 6.0, 7.0, 8.0]
        assert r["allreduce_sum"] == [10.0, 12.0, 14.0, 16.0]
        assert r["metric_average"] == 1.5


def test_broadcast_takes_rank0_value(results):
    assert all(r["broadcast"] == [7.0, 7.0, 7.0] for r in results)


def test_parameters_and_optimizer_state_come_from_rank0(results):
    r0, r1 = results
    assert r0["before_broadcast"] != r1["before_broadcast"], "ranks should start different"
    # Rank 0's parameters are not moved (no spurious weight-decay step), and everyone has them.
    assert r0["after_broadcast"] == r0["before_broadcast"] == r1["after_broadcast"]
    # The wrapped optimizer keeps rank 0's state (Horovod's wrapper alone would start it empty).
    assert r0["opt_state"] == r0["opt_state_before"] == r1["opt_state"]
    assert all(r["opt_hparams"] == {"lr": 1e-2, "betas": [0.9, 0.999], "weight_decay": 0.1} for r in results)


def test_two_half_batches_equal_one_whole_batch_in_fp32(results):
    for r in results:
        assert r["equivalence"]["mlp_fp32"]["max_abs_diff"] < 1e-5
        assert r["equivalence"]["transformer_fp32"]["max_abs_diff"] < 1e-5


def test_fp16_compression_stays_within_its_rounding(results):
    for r in results:
        fp16 = r["equivalence"]["mlp_fp16"]
        assert fp16["max_diff_over_fp16_bound"] <= 1.0
        assert fp16["max_abs_diff"] > 0, "fp16 compression did not change anything: was it applied?"


def test_each_sample_is_read_exactly_once_per_epoch_across_ranks(results):
    for epoch in ("1", "2"):
        parts = [r["shards"][epoch]["ids"] for r in results]
        assert sorted(parts[0] + parts[1]) == list(range(N_SAMPLES))
        assert abs(len(parts[0]) - len(parts[1])) <= 1
        assert results[0]["shards"][epoch]["steps"] == results[1]["shards"][epoch]["steps"]


def test_order_changes_between_epochs(results):
    for r in results:
        assert r["shards"]["1"]["ids"] != r["shards"]["2"]["ids"]
