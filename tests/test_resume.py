"""Checkpoint and resume through the real launcher: a run stopped after epoch k resumes at k+1 from
exactly the saved parameters, and ends where an uninterrupted run ends."""
import shutil

import pytest
import torch

import orphans
from conftest import check_reported_events, cli, events_of, session_members
from hvdk8s import checkpoint
from hvdk8s.trainer.job import parameter_digest

pytestmark = pytest.mark.ranks


def launch(job, *extra) -> str:
    """The launch's records, one a line (read with events_of)."""
    proc = cli("launch", "--local", "-np", "2", "--log-format", "json", job, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def final_digest(out: str) -> str:
    [done] = events_of(out, "done")
    return done["digest"]


def epochs_trained(out: str) -> list[int]:
    return [e["epoch"] for e in events_of(out, "epoch")]


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
    assert [(e["path"], e["epoch"], e["digest"]) for e in events_of(second, "resume")] == \
        [(str(checkpoint.path_for(ckpt, 2)), 2, parameter_digest(saved["model"]))], second
    assert epochs_trained(second) == [3, 4]
    # Same data order, learning-rate schedule and optimizer state: the same model as without a stop.
    assert final_digest(second) == straight_digest

    # --no-resume starts over beside newer checkpoints, and arrives where the straight run was after epoch 2.
    again = launch(job_file({"training": {"epochs": 2, "checkpoint": {"dir": str(ckpt)}}}, "again.yaml"), "--no-resume")
    assert events_of(again, "resume") == [] and epochs_trained(again) == [1, 2], again
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

    errors = tmp_path / "launch.stderr"  # the launches' own (stdout is records only)

    def train() -> subprocess.Popen:
        with open(errors, "a") as stderr:
            return subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "1",
                                     "--log-format", "json", str(job)],
                                    text=True, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)

    def resumed(text: str) -> list[tuple[str, int]]:
        return [(e["path"], e["epoch"]) for e in events_of(text, "resume")]

    resumed_from = []
    for trial in range(4):  # each is a launch (seconds of imports): 4 keep the suite within its time
        expected = newest_complete()
        proc = train()
        out, epochs = [], 0
        for line in proc.stdout:  # two epochs (so the first one's checkpoint is whole), then kill at a random moment
            out.append(line)
            epochs += len(events_of(line, "epoch"))
            if epochs == 2:
                break
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment to kill at, not a wait for anything
        rank = list(procs.ranks(proc.pid).values())
        # (twice in full CI runs of 2026-12-04, never alone: trial 0's launch ended with status 1 before its
        # first record, nothing on its stdout or stderr; this message keeps all there is for the next time)
        assert len(rank) == 1, (trial, epochs, proc.poll(), "".join(out), errors.read_text())
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
            assert resumed(text) == [(str(checkpoint.path_for(ckpt, expected)), expected)], (trial, text)
        resumed_from.append(expected)
    expected = newest_complete()
    job.write_text(job.read_text().replace("epochs: 200", f"epochs: {expected + 1}"))
    final = train()
    text = final.communicate()[0]
    assert final.returncode == 0, text + errors.read_text()
    assert resumed(text) == [(str(checkpoint.path_for(ckpt, expected)), expected)], text
    assert not [p.name for p in ckpt.iterdir() if is_part(p.name)], sorted(os.listdir(ckpt))
    assert resumed_from == sorted(set(resumed_from)), resumed_from  # every launch got further, whatever its speed
