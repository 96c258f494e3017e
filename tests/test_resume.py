"""Checkpoint and resume through the real launcher: a run stopped after epoch k resumes at k+1 from
exactly the saved parameters, and ends where an uninterrupted run ends."""
import re

import pytest
import torch

from conftest import cli
from hvdk8s import checkpoint
from hvdk8s.trainer.job import parameter_digest

pytestmark = pytest.mark.ranks


def launch(job, *extra):
    proc = cli("launch", "--local", "-np", "2", job, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def final_digest(out: str) -> str:
    return re.search(r"done: .*\(parameters (\w+)\)", out).group(1)


def epochs_trained(out: str) -> list[int]:
    return [int(e) for e in re.findall(r"^epoch (\d+)/\d+ ", out, re.M)]


def test_stopped_run_resumes_from_exact_parameters(job_file, tmp_path):
    ckpt = tmp_path / "ckpt"
    straight = launch(job_file({"training": {"epochs": 4}}, "straight.yaml"))

    first = launch(job_file({"training": {"epochs": 2, "checkpoint": {"dir": str(ckpt)}}}, "first.yaml"))
    assert epochs_trained(first) == [1, 2]
    saved = torch.load(checkpoint.path_for(ckpt, 2), weights_only=True)
    assert saved["epoch"] == 2

    second = launch(job_file({"training": {"epochs": 4, "checkpoint": {"dir": str(ckpt)}}}, "second.yaml"))
    resumed = re.search(r"resumed from (\S+) \(epoch (\d+), parameters (\w+)\)", second)
    assert resumed, second
    assert resumed.group(2) == "2"
    assert resumed.group(3) == parameter_digest(saved["model"])
    assert epochs_trained(second) == [3, 4]
    # Same data order, learning-rate schedule and optimizer state: the same model as without a stop.
    assert final_digest(second) == final_digest(straight)


def test_no_resume_starts_over(job_file, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = job_file({"training": {"epochs": 1, "checkpoint": {"dir": str(ckpt)}}})
    launch(job)
    again = launch(job, "--no-resume")
    assert "resumed" not in again
    assert epochs_trained(again) == [1]
