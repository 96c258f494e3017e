"""`hvdk8s launch --local -np 2`: the real CLI starting real ranks on the digits job."""
import re

import pytest

from conftest import cli

pytestmark = pytest.mark.ranks


def accuracy(output: str) -> float:
    m = re.search(r"done: test accuracy ([\d.]+)%", output)
    assert m, f"no final accuracy in the output:\n{output}"
    return float(m.group(1)) / 100


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_digits_reaches_95_percent_on_two_ranks(job_file, compression):
    job = job_file({"training": {"compression": compression}})
    proc = cli("launch", "--local", "-np", "2", job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"2 ranks, compression {compression}" in proc.stdout
    assert accuracy(proc.stdout) >= 0.95


def test_gloo_controller_trains_too(job_file):
    proc = cli("launch", "--local", "-np", "2", "--gloo", job_file({"training": {"epochs": 8}}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert accuracy(proc.stdout) >= 0.90


def test_auto_compression_is_none_on_cpu(job_file):
    proc = cli("launch", "--local", "-np", "2", job_file({"training": {"epochs": 1, "compression": "auto"}}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compression none" in proc.stdout


def test_failing_ranks_make_launch_fail(job_file, tmp_path):
    # A shard dataset path that does not exist: the ranks fail, and so must the launch.
    job = job_file({"dataset": {"path": str(tmp_path / "missing"), "name": None}})
    proc = cli("launch", "--local", "-np", "2", job)
    assert proc.returncode != 0
    assert "no shard index" in proc.stdout + proc.stderr
