"""Two real Horovod ranks (horovodrun, MPI controller): collectives, broadcast, equivalence, clipping and
mixed precision, resume, sharding."""
import math

import numpy as np
import pytest

from conftest import rank_results, run_ranks
from hvdk8s.data.shards import write_shards

pytestmark = pytest.mark.ranks

N_SAMPLES = 103  # odd on purpose: the parts differ by one sample


@pytest.fixture(scope="module")
def ranks_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    shards = tmp_path_factory.mktemp("shards")
    ids = np.arange(N_SAMPLES)
    write_shards(shards, {"x": ids.astype(np.float32)[:, None], "y": ids}, samples_per_shard=10,
                 info={"input_shape": [1], "num_classes": N_SAMPLES})
    proc = run_ranks("collectives.py", out, shards)
    return proc, rank_results(out)


@pytest.fixture(scope="module")
def results(ranks_run):
    return ranks_run[1]


def test_every_rank_ran_with_one_thread_on_this_machine(results):
    import os

    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    assert all(r["threads"] == max(1, (os.cpu_count() or 1) // 2) for r in results)
    assert all(r["threads_given"] == 3 for r in results)


def test_ranks_of_a_two_rank_job_keep_horovods_cycle(results):
    assert all(r["cycle_time"] is None for r in results)  # Horovod's 1 ms: the 20 ms one is for a rank alone


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


def test_the_direct_gradient_launch_averages_exactly_as_horovods_own(results):
    for r in results:
        assert {label: c["direct"] for label, c in r["launch"].items()} == {
            "average": True, "average, predivided": True, "sum": True, "adasum": False}  # Adasum: Horovod's
        assert all(c["identical"] for c in r["launch"].values()), r["launch"]


def test_fp16_compression_stays_within_its_rounding(results):
    for r in results:
        fp16 = r["equivalence"]["mlp_fp16"]
        assert fp16["max_diff_over_fp16_bound"] <= 1.0
        assert fp16["max_abs_diff"] > 0, "fp16 compression did not change anything: was it applied?"


def test_step_clips_the_averaged_gradient_like_one_process_on_the_whole_batch(results):
    for key in ("clip_fp32", "clip_fp32_accumulated"):  # the second: 2 backward passes per step
        for r in results:
            c = r["step"][key]
            assert all(n > c["clip"] for n in c["norms_before_clip"]), c  # clipping really happened
            assert c["clipping_effect"] > 1e-3, c  # and changed the result
            assert c["applied"] == [True] * 3
            assert c["max_abs_diff"] < 1e-6, c  # float32 rounding of values near 1
        assert results[0]["step"][key]["digest"] == results[1]["step"][key]["digest"]


def test_fp16_autocast_with_loss_scaling_trains_like_fp32(results):
    r0, r1 = (r["step"]["fp16"] for r in results)
    for r in (r0, r1):
        assert r["forward_dtype"] == "torch.float16"
        assert r["enabled"] and r["applied"] == [True] * 4
        assert r["scale"] > 1 and r["finite"]
        # The forward sees weights rounded to fp16 (11-bit significand), so updates smaller than a
        # weight's fp16 spacing are partly invisible: after 4 steps one process with fp16 AMP is 2.2% of
        # the fp32 run's largest parameter movement away from fp32 (measured 1.4e-4 of 6.4e-3).
        assert r["max_abs_diff"] <= 0.05 * r["max_update"], r
        # The distribution adds (almost) nothing to that: against one process doing fp16 AMP on the
        # whole batch, 0.05% of the movement (measured 3.0e-6; half- vs whole-batch fp16 rounding).
        assert r["max_abs_diff_amp_reference"] <= 0.005 * r["max_update"], r
    assert r0["scale"] == r1["scale"]
    assert r0["digest"] == r1["digest"]


def test_fp16_overflow_on_one_rank_skips_the_step_on_both(results):
    for r in results:
        o = r["step"]["fp16"]["overflow"]
        assert o["applied"] is False and o["unchanged"], o
        assert o["scale_after"] < o["scale_before"], o
    assert results[0]["step"]["fp16"]["overflow"] == results[1]["step"]["fp16"]["overflow"]


def test_bf16_autocast_runs_the_forward_in_bfloat16(results):
    for r in results:
        b = r["step"]["bf16"]
        assert b["forward_dtype"] == "torch.bfloat16" and b["fp32_forward_dtype"] == "torch.float32"
        assert b["scaler"] is None and b["applied"] and b["changed"]
        assert "precision must be one of fp32, bf16, fp16" in b["bad_precision"]
    assert results[0]["step"]["bf16"]["digest"] == results[1]["step"]["bf16"]["digest"]


def test_learning_rate_scales_with_ranks_and_passes(results):
    for r in results:
        assert r["scaled_lr"] == pytest.approx([0.2, 0.1 * math.sqrt(2), 0.4, 0.1])


def test_resume_skips_checkpoints_of_other_models(ranks_run):
    proc, results = ranks_run
    for r in results:  # epochs 3 (optimizer groups differ) and 2 (other layer sizes) are passed over
        assert r["resume"] == {"epoch": 1, "file": "epoch-00001.ckpt", "note": "mine",
                               "model_restored": True, "optimizer_restored": True}
    skipped = [line for line in proc.stderr.splitlines() if "skipping checkpoint" in line]
    assert len(skipped) == 2 and "epoch-00003" in skipped[0] and "epoch-00002" in skipped[1], proc.stderr
    assert "Traceback" not in proc.stderr


def test_each_sample_is_read_exactly_once_per_epoch_across_ranks(results):
    for epoch in ("1", "2"):
        parts = [r["shards"][epoch]["ids"] for r in results]
        assert sorted(parts[0] + parts[1]) == list(range(N_SAMPLES))
        assert abs(len(parts[0]) - len(parts[1])) <= 1
        assert results[0]["shards"][epoch]["steps"] == results[1]["shards"][epoch]["steps"]


def test_order_changes_between_epochs(results):
    for r in results:
        assert r["shards"]["1"]["ids"] != r["shards"]["2"]["ids"]


@pytest.mark.parametrize("key", ["slow_peer_wait", "slow_peer_wait_powersgd"])
def test_a_rank_waiting_for_its_peer_sleeps_instead_of_spinning(results, key):
    """Rank 0's training thread waits 1.5 s in step() for a late peer, with plain or PowerSGD averaging;
    Horovod's own wait would keep it runnable (sched_yield in a loop), taking a core from the peer and
    from any other job."""
    wait = results[0][key]
    assert wait["wall_s"] > 1.0, wait  # it did wait for rank 1
    assert wait["thread_cpu_s"] < 0.1 * wait["wall_s"], wait
