"""TensorFlow / Keras 3 behind Horovod on 2 real ranks: collectives, equivalence, tf.data sharding,
and the same job file training under both frameworks."""
import re

import pytest
import yaml

from conftest import DIGITS_JOB, cli, rank_results, run_ranks

pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf-ranks")
    run_ranks("tf_collectives.py", out)
    return rank_results(out)


def test_ranks_share_the_cores_and_average(results):
    import os

    assert all(r["threads"] == max(1, (os.cpu_count() or 1) // 2) for r in results)
    assert all(r["allreduce_average"] == [1.5, 5.0] for r in results)


def test_variables_and_optimizer_state_come_from_rank0(results):
    r0, r1 = results
    assert r0["before_broadcast"] != r1["before_broadcast"], "ranks should start different"
    assert r0["after_broadcast"] == r0["before_broadcast"] == r1["after_broadcast"]
    assert r0["opt_after"] == r0["rank0_opt_before"] == r1["opt_after"]


def test_half_batches_on_two_ranks_equal_the_whole_batch(results):
    for r in results:
        assert r["equivalence"]["tape_fp32"]["max_abs_diff"] < 1e-5
        assert r["equivalence"]["fit_fp32"]["max_abs_diff"] < 1e-5


def test_fp16_stays_within_its_rounding(results):
    for r in results:
        fp16 = r["equivalence"]["tape_fp16"]
        assert 0 < fp16["max_abs_diff"] and fp16["max_diff_over_fp16_bound"] <= 1.0


def test_tf_data_reads_each_sample_once_with_exact_weights(results):
    for epoch in ("1", "2"):
        parts = [r["shards"][epoch] for r in results]
        assert sorted(parts[0]["ids"] + parts[1]["ids"]) == list(range(103))
        assert parts[0]["steps"] == parts[1]["steps"]
        # weights size/global_count add up to `size` per step over the ranks
        assert sum(p["weight_sum"] for p in parts) == pytest.approx(2 * parts[0]["steps"])
    assert results[0]["shards"]["1"]["ids"] != results[0]["shards"]["2"]["ids"]


def accuracy(output: str) -> float:
    m = re.search(r"done: test accuracy ([\d.]+)%", output)
    assert m, output
    return float(m.group(1)) / 100


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_same_job_file_trains_under_both_frameworks(tmp_path, framework):
    data = yaml.safe_load(DIGITS_JOB.read_text())
    data["framework"] = framework  # the only change
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    proc = cli("launch", "--local", "-np", "2", job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"job digits-mlp: {framework} mlp on digits, 2 ranks" in proc.stdout
    assert accuracy(proc.stdout) >= 0.95


def test_keras_fit_cnn_with_fp16_reaches_95_percent(job_file):
    job = job_file({"framework": "tensorflow", "model": {"name": "cnn", "args": {"channels": [16, 32]}},
                    "training": {"compression": "fp16"}})
    proc = cli("launch", "--local", "-np", "2", job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compression fp16" in proc.stdout
    assert accuracy(proc.stdout) >= 0.95


def test_tensorflow_run_resumes_from_its_checkpoint(job_file, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = cli("launch", "--local", "-np", "2",
                job_file({"framework": "tensorflow", "training": {"epochs": 2, "checkpoint": {"dir": str(ckpt)}}},
                         "first.yaml"))
    assert first.returncode == 0, first.stdout + first.stderr
    saved = re.search(r"done: .*\(parameters (\w+)\)", first.stdout).group(1)
    second = cli("launch", "--local", "-np", "2",
                 job_file({"framework": "tensorflow", "training": {"epochs": 4, "checkpoint": {"dir": str(ckpt)}}},
                          "second.yaml"))
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = re.search(r"resumed from \S+ \(epoch (\d+), parameters (\w+)\)", second.stdout)
    assert resumed and resumed.groups() == ("2", saved)
    assert [int(e) for e in re.findall(r"^epoch (\d+)/4 ", second.stdout, re.M)] == [3, 4]
    straight = cli("launch", "--local", "-np", "2",
                   job_file({"framework": "tensorflow", "training": {"epochs": 4}}, "straight.yaml"))
    assert re.search(r"parameters (\w+)\)\s*$", straight.stdout).group(1) == \
        re.search(r"parameters (\w+)\)\s*$", second.stdout).group(1)
