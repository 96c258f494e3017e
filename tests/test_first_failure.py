"""A failed launch ends with one line naming the rank that failed first, its exception and where
(hvdk8s.failures), not with mpirun's word on whichever rank exited first or another rank's consequent
HorovodInternalError: real ranks under `hvdk8s launch --local -np 2`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import RANK_SCRIPTS, ROOT

pytestmark = [pytest.mark.ranks, pytest.mark.after_the_node]  # a third rank stream (tests/workgroups.py)

# A model of the user's that the built-in trainer trains: its forward pass fails on rank 1 only.
FAULTY_MODEL = """\
import math
import os

import torch


class FailsOnRank1(torch.nn.Module):
    def __init__(self, num_classes, input_shape):
        super().__init__()
        self.linear = torch.nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            raise RuntimeError("boom on rank 1")
        return self.linear(x.flatten(1))


def model(num_classes, input_shape):
    return FailsOnRank1(num_classes, input_shape)
"""


def _launch(job: Path, *options: str) -> tuple[int, list[str]]:
    """`hvdk8s launch --local -np 2 JOB` as a user runs it: its exit status and its output (stdout and
    stderr as a terminal shows them, interleaved)."""
    run = subprocess.run([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "2", *options, str(job)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return run.returncode, run.stdout.splitlines()


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _script_job(tmp_path: Path, script: str, rank: int) -> Path:
    """A job running `script` of tests/ranks, whose rank `rank` raises."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "boom", "framework": "pytorch",
                                   "entrypoint": {"script": str(RANK_SCRIPTS / script), "args": [str(rank)]},
                                   "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}))
    return job


@pytest.mark.parametrize("script, rank", [("raise_on_rank.py", 1), ("raise_on_rank.py", 0),
                                          ("raise_on_rank_hvdk8s.py", 1)])
def test_a_script_job_ends_naming_the_rank_that_raised(tmp_path, script, rank):
    """An unchanged Horovod script (whichever rank raises), and one written against hvdk8s.torch."""
    code, out = _launch(_script_job(tmp_path, script, rank))
    line = _line_of(RANK_SCRIPTS / script, "raise RuntimeError")
    assert out[-1] == f"rank {rank} failed first: RuntimeError: boom on rank {rank} ({script}:{line})", "\n".join(out)
    assert code == 1, "\n".join(out)
    # The other rank failed too, as a consequence: in the output above, never in the last line.
    assert any("HorovodInternalError" in o or "Horovod has been shut down" in o for o in out[:-1]), "\n".join(out)


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_a_rank_killed_by_a_signal_is_named_above_the_others_consequent_errors(tmp_path, controller):
    """No traceback of its own: the launcher's word on how it died (mpirun's, horovodrun's) names it, and
    the other rank's HorovodInternalError, though a Python error, is only a consequence."""
    code, out = _launch(_script_job(tmp_path, "die_on_rank.py", 1), f"--{controller}")
    assert out[-1] == "rank 1 failed first: killed by signal 9 (Killed)", "\n".join(out)
    assert code != 0, "\n".join(out)


def test_the_trainer_ends_naming_the_rank_whose_model_raised(tmp_path, job_file):
    (tmp_path / "faulty.py").write_text(FAULTY_MODEL)
    job = job_file({"model": {"name": None, "args": {}, "factory": "faulty:model"}, "training": {"epochs": 2}})
    code, out = _launch(job)
    line = _line_of(tmp_path / "faulty.py", "raise RuntimeError")
    assert out[-1] == f"rank 1 failed first: RuntimeError: boom on rank 1 (faulty.py:{line})", "\n".join(out)
    assert code == 1, "\n".join(out)


def test_a_job_that_succeeds_names_no_failed_rank(tmp_path):
    code, out = _launch(_script_job(tmp_path, "raise_on_rank.py", -1))
    assert code == 0 and not any("failed first" in o for o in out), "\n".join(out)
