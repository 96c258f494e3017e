"""TensorFlow / Keras 3 behind Horovod on 2 real ranks: collectives, equivalence (also with gradient
clipping), mixed precision, checkpoints, tf.data sharding, and the same job file training under both
frameworks."""
import math
import shutil

import pytest
import yaml

from conftest import DIGITS_JOB, check_reported_events, cli, events_of, rank_results, run_ranks
from hvdk8s import checkpoint

pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """One horovodrun of tests/ranks/tf_collectives.py (each start costs seconds): its stderr and results."""
    out = tmp_path_factory.mktemp("tf-ranks")
    proc = run_ranks("tf_collectives.py", out)
    return proc.stderr, rank_results(out)


@pytest.fixture(scope="module")
def results(ranks):
    return ranks[1]


def test_ranks_share_the_cores_and_average(results):
    import os

    assert all(r["threads"] == max(1, (os.cpu_count() or 1) // 2) for r in results)
    assert all(r["allreduce_average"] == [1.5, 5.0] for r in results)


def test_distribute_broadcasts_a_built_model_at_once(results):
    r0, r1 = results
    assert r0["before_distribute"] != r1["before_distribute"], "ranks should start different"
    assert r0["after_distribute"] == r1["after_distribute"] == r0["before_distribute"]


def test_variables_and_optimizer_state_come_from_rank0(results):
    r0, r1 = results
    assert r0["before_broadcast"] != r1["before_broadcast"], "rank 0 alone took a step"
    assert r0["after_broadcast"] == r0["before_broadcast"] == r1["after_broadcast"]
    assert r0["opt_after"] == r0["rank0_opt_before"] == r1["opt_after"]


def test_half_batches_on_two_ranks_equal_the_whole_batch(results):
    for r in results:
        assert r["equivalence"]["tape_fp32"]["max_abs_diff"] < 1e-5
        assert r["equivalence"]["fit_fp32"]["max_abs_diff"] < 1e-5


def test_accumulated_micro_batches_on_two_ranks_equal_one_process(results):
    """backward_passes_per_step=2 in model.fit: one allreduce per update, inside the graph's update branch."""
    for r in results:
        accumulated = r["equivalence"]["fit_accumulated"]
        assert accumulated["updates"] == 2 and accumulated["max_abs_diff"] < 1e-5


def test_fp16_compression_stays_within_its_rounding(results):
    for r in results:
        fp16 = r["equivalence"]["tape_fp16"]
        assert 0 < fp16["max_abs_diff"] and fp16["max_diff_over_fp16_bound"] <= 1.0


def test_global_clipnorm_acts_on_the_averaged_gradients(results):
    for r in results:
        clipped = r["equivalence"]["tape_clipped"]
        assert min(clipped["unclipped_norms"]) > clipped["clipnorm"], "every step must really clip"
        assert clipped["max_abs_diff"] < 1e-6  # = one process clipping the whole batch's gradient
        # Clipping each rank's own gradients before averaging would move the first update this much:
        # far beyond the difference seen, so the match above is not a coincidence.
        assert clipped["clip_before_average_diff"] > 100 * max(clipped["max_abs_diff"], 1e-7)


def test_fp16_with_loss_scaling_trains_in_step_on_both_ranks(results):
    r0, r1 = (r["fp16"] for r in results)
    for f in (r0, r1):
        assert f["same_init_as_fp32"] and f["inner_distributed"]
        assert (f["compute_dtype"], f["variable_dtype"]) == ("float16", "float32")
        assert f["finite"] and f["iterations"] == 3 and f["scale"] > 1
        # fp16 activations and gradients against fp32 on the whole batch, both clipped at the same norm:
        # within 10% of the largest parameter change of those 3 steps (measured: about 4.5%).
        assert f["max_abs_diff_vs_fp32"] <= 0.1 * f["max_update_fp32"]
        # Overflow on rank 1 only: the averaged gradients are non-finite on both, so both skip the step
        # and halve the scale (and neither waits for an allreduce the other skipped).
        assert f["overflow_step"] == {"params_unchanged": True, "scale": f["scale"] / 2, "iterations": 3}
        assert f["fit"]["finite"]
    assert r0["digest"] == r1["digest"] and r0["fit"]["digest"] == r1["fit"]["digest"]


def test_bf16_policy_builds_bfloat16_layers_that_train(results):
    r0, r1 = (r["bf16"] for r in results)
    for b in (r0, r1):
        assert (b["compute_dtype"], b["variable_dtype"]) == ("bfloat16", "float32")
        assert b["changed"] and math.isfinite(b["loss"])
    assert r0["digest"] == r1["digest"]


def test_distribute_keeps_state_passes_horovod_options_and_refuses_misuse(results):
    for r in results:
        o = r["options"]
        assert o["state_kept"] and o["lso_accumulation"] == 2
        assert o["prescale_max_abs_diff"] < 1e-6
        refused = {"unknown_option": "TypeError", "bad_compression": "ValueError", "twice": "ValueError",
                   "inner_distributed": "ValueError", "extra_not_a_dict": "TypeError"}
        assert {k: o[k] for k in refused} == refused


def test_checkpoint_keeps_extra_and_skips_another_models_file(ranks):
    stderr, results = ranks
    for r in results:
        c = r["checkpoint"]
        assert c["epoch"] == 1 and c["extra"]["note"] == "digits" and c["extra"]["lr"] == 0.1
        assert c["extra"]["path"].endswith("epoch-00001.ckpt")
        assert c["loaded"] == c["saved"] and c["loaded_opt"] == c["saved_opt"]
    assert "epoch-00002.ckpt: not a checkpoint of this job" in stderr
    assert "4 model arrays, this model has 6" in stderr


def test_tf_data_reads_each_sample_once_with_exact_weights(results):
    for epoch in ("1", "2"):
        parts = [r["shards"][epoch] for r in results]
        assert sorted(parts[0]["ids"] + parts[1]["ids"]) == list(range(103))
        assert parts[0]["steps"] == parts[1]["steps"]
        # weights size/global_count add up to `size` per step over the ranks
        assert sum(p["weight_sum"] for p in parts) == pytest.approx(2 * parts[0]["steps"])
    assert results[0]["shards"]["1"]["ids"] != results[0]["shards"]["2"]["ids"]


def started_and_done(output: str) -> tuple[dict, dict]:
    """The start and done events of a `--log-format json` launch: one each."""
    started, done = events_of(output, "start"), events_of(output, "done")
    assert len(started) == len(done) == 1, output
    return started[0], done[0]


def test_keras_fit_cnn_with_fp16_reaches_95_percent(job_file):
    job = job_file({"framework": "tensorflow", "model": {"name": "cnn", "args": {"channels": [16, 32]}},
                    "training": {"compression": "fp16"}})
    proc = cli("launch", "--local", "-np", "2", "--log-format", "json", job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started, done = started_and_done(proc.stdout)
    assert started["compression"] == "fp16"
    assert done["test_accuracy"] >= 0.95, proc.stdout


def test_the_digits_job_file_trains_under_tensorflow_and_resumes_from_its_checkpoint(tmp_path):
    """The digits job file with only its framework changed trains under TensorFlow (under PyTorch, as it
    is, in the README's quickstart, test_readme.py), its checkpoints sent to a folder of the test's from the
    command line. Read as a log stack reads it: the Keras loop reports the trainer's events (progress within
    each epoch, each checkpoint) as the PyTorch loop does. Its epoch-13 checkpoint is what a run stopped
    there left behind: a launch from it ends on the same model."""
    data = yaml.safe_load(DIGITS_JOB.read_text())
    data["framework"] = "tensorflow"  # the only change
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    epochs = data["training"]["epochs"]
    straight_dir = tmp_path / "straight"
    straight = cli("launch", "--local", "-np", "2", "--log-format", "json", job,
                   "--set", f"training.checkpoint.dir={straight_dir}", env={"HVDK8S_PROGRESS_EVERY_S": "0"})
    assert straight.returncode == 0, straight.stdout + straight.stderr
    [started] = events_of(straight.stdout, "start")
    assert {k: started[k] for k in ("job", "framework", "model", "dataset", "ranks", "compression")} == \
        {"job": "digits-mlp", "framework": "tensorflow", "model": "mlp", "dataset": "digits", "ranks": 2,
         "compression": "none"}  # auto, on CPU
    done = check_reported_events(straight.stdout, straight_dir, epochs=epochs)
    assert done["test_accuracy"] >= 0.95, straight.stdout

    stopped_at = epochs - 2
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(checkpoint.path_for(straight_dir, stopped_at), checkpoint.path_for(ckpt, stopped_at))
    second = cli("launch", "--local", "-np", "2", "--log-format", "json", job,
                 "--set", f"training.checkpoint.dir={ckpt}")
    assert second.returncode == 0, second.stdout + second.stderr
    assert [(e["path"], e["epoch"]) for e in events_of(second.stdout, "resume")] == \
        [(str(checkpoint.path_for(ckpt, stopped_at)), stopped_at)], second.stdout
    assert [(e["epoch"], e["epochs"]) for e in events_of(second.stdout, "epoch")] == \
        [(stopped_at + 1, epochs), (epochs, epochs)], second.stdout
    # Same data order, learning-rate schedule and optimizer state: the same model as without a stop.
    assert [e["digest"] for e in events_of(second.stdout, "done")] == [done["digest"]], second.stdout
