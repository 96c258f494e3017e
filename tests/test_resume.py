"""Checkpoint and resume through the real launcher: a run stopped after epoch k resumes at k+1 from
exactly the saved parameters, and ends where an uninterrupted run ends."""
import re
import shutil

import pytest
import torch

import orphans
from conftest import check_reported_events, cli, session_members
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
    # 4 epochs straight through, read as a log stack reads them (records, progress at every step): the
    # events rank 0 reports. Its epoch-2 checkpoint is what a run stopped after epoch 2 left behind.
    straight_dir = tmp_path / "straight"
    straight = cli("launch", "--local", "-np", "2", "--log-format", "json",
                   job_file({"training": {"epochs": 4, "checkpoint": {"dir": str(straight_dir)}}}, "straight.yaml"),
                   env={"HVDK8S_PROGRESS_EVERY_S": "0"})
    assert straight.returncode == 0, straight.stdout + straight.stderr
    straight_digest = check_reported_events(straight.stdout, straight_dir, epochs=4)["digest"]

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(checkpoint.path_for(straight_dir, 2), checkpoint.path_for(ckpt, 2))
    saved = torch.load(checkpoint.path_for(ckpt, 2), weights_only=True)
    assert saved["epoch"] == 2

    second = launch(job_file({"training": {"epochs": 4, "checkpoint": {"dir": str(ckpt)}}}, "second.yaml"))
    resumed = re.search(r"resumed from (\S+) \(epoch (\d+), parameters (\w+)\)", second)
    assert resumed, second
    assert resumed.group(2) == "2"
    assert resumed.group(3) == parameter_digest(saved["model"])
    assert epochs_trained(second) == [3, 4]
    # Same data order, learning-rate schedule and optimizer state: the same model as without a stop.
    assert final_digest(second) == straight_digest

    # --no-resume starts over beside newer checkpoints, and arrives where the straight run was after epoch 2.
    again = launch(job_file({"training": {"epochs": 2, "checkpoint": {"dir": str(ckpt)}}}, "again.yaml"), "--no-resume")
    assert "resumed" not in again and epochs_trained(again) == [1, 2]
    assert final_digest(again) == parameter_digest(saved["model"])


@pytest.mark.one_rank
def test_kill_9_at_random_moments_always_resumes_from_the_newest_complete_checkpoint(job_file, tmp_path):
    """4 launches killed with SIGKILL (the launcher's whole process group, as a terminal's or a CI
    runner's kill does) at random moments, mid-epoch or mid-write: no rank outlives its launcher, each
    next launch resumes from the newest checkpoint that is complete, and no temporary file survives the
    run after. One rank (`launch --local -np 1`), so that the trials are many."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    from hvdk8s.core.atomic import is_part
    from hvdk8s.launch import procs

    ckpt = tmp_path / "ckpt"
    job = job_file({"model": {"name": "mlp", "args": {"hidden": [512, 512]}},  # 2 MB checkpoints
                    "training": {"epochs": 200, "checkpoint": {"dir": str(ckpt), "keep": 2}}})
    rng = random.Random(12345)

    def newest_complete() -> int:
        for epoch, path in checkpoint.list_checkpoints(ckpt):
            try:
                torch.load(path, weights_only=True)
                return epoch
            except Exception:
                continue
        return 0

    def train() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "1", str(job)],
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    resumed_from = []
    for trial in range(4):  # each is a launch (seconds of imports): 4 keep the suite within its time
        expected = newest_complete()
        proc = train()
        out, epochs = [], 0
        for line in proc.stdout:  # two epochs (so the first one's checkpoint is whole), then kill at a random moment
            out.append(line)
            epochs += line.startswith("epoch ")
            if epochs == 2:
                break
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment to kill at, not a wait for anything
        rank = list(procs.ranks(proc.pid).values())
        assert len(rank) == 1, "".join(out)
        with orphans.adopting():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            ended = orphans.ends(rank)  # the rank dies with its launcher, not by running on to its end
        survivors = orphans.gone(session_members, proc.pid)  # mpirun gives ranks groups of their own
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert list(ended.values()) == ["SIGKILL"] and not survivors, (trial, ended, survivors)
        out.append(proc.stdout.read())
        text = "".join(out)
        if expected:
            assert f"resumed from {checkpoint.path_for(ckpt, expected)} (epoch {expected}," in text, (trial, text)
        resumed_from.append(expected)
    expected = newest_complete()
    job.write_text(job.read_text().replace("epochs: 200", f"epochs: {expected + 1}"))
    final = train()
    text = final.communicate()[0]
    assert final.returncode == 0, text
    assert f"resumed from {checkpoint.path_for(ckpt, expected)} (epoch {expected}," in text
    assert not [p.name for p in ckpt.iterdir() if is_part(p.name)], sorted(os.listdir(ckpt))
    assert resumed_from == sorted(set(resumed_from)), resumed_from  # every launch got further, whatever its speed
