"""One launcher protocol, two back ends; a cluster log read by the local launch's progress view.

No API server here: the verbs' signatures, the phase a set of operator conditions means, the event
forms a launcher log carries, and the local back end driven through the protocol on real ranks.
"""
from __future__ import annotations

import inspect
import io
import json
import math
import textwrap

import pytest

from hvdk8s import events
from hvdk8s.launch import base, logview
from hvdk8s.launch.kubernetes import KubernetesLauncher
from hvdk8s.launch.local import LocalLauncher

VERBS = ("submit", "status", "logs", "wait", "delete")

EVENTS = [
    {"event": "start", "job": "digits-mlp", "framework": "pytorch", "model": "mlp", "dataset": "digits", "ranks": 2,
     "compression": "none", "precision": "fp32", "lr": 0.1, "steps_per_epoch": 23},
    {"event": "start", "job": "j", "framework": "tensorflow", "model": "cnn (channels 16, 32)",
     "dataset": "synthetic-images on 3 shards", "ranks": 16, "compression": "fp16", "precision": "bf16",
     "lr": 0.0012345, "steps_per_epoch": 7},
    {"event": "resume", "epoch": 3, "path": "/ckpt/epoch-3", "digest": "8b2ac359d47df739"},
    {"event": "progress", "epoch": 2, "step": 11, "steps": 23, "loss": 0.4321, "samples_per_s": 32571.4},
    {"event": "epoch", "epoch": 1, "epochs": 15, "loss": 2.2286, "accuracy": 0.2156, "test_loss": 1.9108,
     "test_accuracy": 0.5097, "samples_per_s": 32571.0, "seconds": 0.04},
    {"event": "epoch", "epoch": 2, "epochs": 2, "loss": math.nan, "accuracy": 1.0, "test_loss": 0.1,
     "test_accuracy": 0.9749, "samples_per_s": 5.0, "seconds": 12.5, "loss_scale": 65536.0},
    {"event": "checkpoint", "epoch": 4, "path": "checkpoints/digits mlp/epoch-4"},
    {"event": "done", "test_accuracy": 0.9749, "epochs": 15, "seconds": 0.5, "digest": "8b2ac359d47df739"},
    {"event": "file", "what": "timeline", "path": "/runs/digits (2)/horovod-timeline.json"},
]


@pytest.mark.parametrize("backend", [LocalLauncher, KubernetesLauncher])
def test_both_back_ends_offer_the_protocols_verbs(backend):
    for verb in VERBS:
        wanted = list(inspect.signature(getattr(base.Launcher, verb)).parameters)
        have = list(inspect.signature(getattr(backend, verb)).parameters)
        assert have[:len(wanted)] == wanted, (backend.__name__, verb, have)


@pytest.mark.parametrize("true, phase", [
    ((), "Pending"),
    (("Created",), "Created"),
    (("Created", "Running"), "Running"),
    (("Created", "Running", "Restarting"), "Restarting"),
    (("Created", "Suspended"), "Suspended"),
    (("Created", "Succeeded"), "Succeeded"),
    (("Created", "Running", "Failed"), "Failed"),
])
def test_conditions_fold_into_one_phase_as_mpi_operator_means_them(true, phase):
    conditions = [base.Condition(kind, "True") for kind in true] + [base.Condition("Running", "False")] * (
        "Running" not in true)
    assert base.phase_of(conditions) == phase


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e["event"])
def test_every_event_reads_back_as_the_same_event_and_its_text_as_output(event):
    """A cluster's rank 0 prints its events as JSON lines (the rendered MPIJob sets HVDK8S_EVENTS=json): the
    view reads them back field for field, behind a rank tag too, and draws them as a local launch does. The
    text a hand-run job prints for people is no event: it is shown as it is."""
    line = "@hvdk8s " + json.dumps(event)
    assert json.dumps(events.parse(line)) == json.dumps(event)
    assert json.dumps(events.parse("[1,0]<stdout>:" + line)) == json.dumps(event)
    assert events.parse(events.format_text(event)) is None


@pytest.mark.parametrize("line", ["", "epoch 1", "job x: what", "done: nothing", "[1,0]<stdout>:epoch 1 step x",
                                  "checkpoint", "@hvdk8s {not json"])
def test_other_output_is_no_event(line):
    assert events.parse(line) is None


def test_a_log_draws_as_the_local_view_draws_its_events():
    from rich.console import Console

    from hvdk8s.launch.progress import ProgressView

    log = ["ssh: worker-0 added", *["@hvdk8s " + json.dumps(e) for e in EVENTS + [EVENTS[4]]]]
    shown, local = io.StringIO(), io.StringIO()
    logview.show(log, Console(file=shown, width=200))
    view = ProgressView(Console(file=local, width=200))
    view.passthrough("ssh: worker-0 added")
    for event in EVENTS + [EVENTS[4]]:
        view.show(event)
    view.close()
    assert shown.getvalue() == local.getvalue()


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("2.5s", 2.5)])
def test_durations(text, seconds):
    from hvdk8s.cli.options import duration

    assert duration(None, None, text) == seconds


def test_flags_of_the_other_back_end_are_refused(job_file):
    from conftest import cli

    job = job_file()
    for args, says in ((("-np", "4"), "-np: only with --local"),
                       (("--local", "--wait"), "--wait: not with --local"),
                       (("--local", "-n", "x", "--dry-run"), "--namespace, --dry-run: not with --local"),
                       (("--timeout", "5m"), "--timeout: only with --wait")):
        run = cli("launch", job, *args)
        assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr


@pytest.mark.ranks
def test_the_local_back_end_through_the_protocol(tmp_path):
    """submit, logs, wait and status on real ranks; delete stops a running job and removes its job file."""
    from hvdk8s.spec import load_job

    (tmp_path / "hello.py").write_text(textwrap.dedent("""
        import sys, time
        import torch
        import horovod.torch as hvd
        hvd.init()
        hvd.allreduce(torch.zeros(1), name="together")  # both ranks print at once below
        for i in range(200):  # unbuffered print writes text and newline apart; lines must still come whole
            print(f"rank {hvd.rank()} of {hvd.size()} line {i}")
        if len(sys.argv) > 1:
            time.sleep(float(sys.argv[1]))
    """))
    (tmp_path / "job.yaml").write_text("name: hello\nframework: pytorch\nentrypoint: {script: hello.py}\n"
                                      "training: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n")
    spec = load_job(tmp_path / "job.yaml")
    launcher = LocalLauncher(np=2)
    assert launcher.submit(spec, tmp_path, str(tmp_path / "job.yaml")) == "hello"
    assert launcher.status("hello").phase == "Running"
    lines = list(launcher.logs("hello", follow=True))
    final = launcher.wait("hello", timeout=120)
    assert final.phase == "Succeeded" and final.exit_code == 0
    said = sorted(line.split(">:", 1)[-1] for line in lines if "rank " in line)
    assert said == sorted(f"rank {r} of 2 line {i}" for r in range(2) for i in range(200)), lines[:20]

    (tmp_path / "slow.yaml").write_text("name: slow\nframework: pytorch\n"
                                      "entrypoint: {script: hello.py, args: ['600']}\ntraining: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n")
    slow = LocalLauncher(np=2)
    slow.submit(load_job(tmp_path / "slow.yaml"), tmp_path, str(tmp_path / "slow.yaml"))
    job_file = slow._tmp.name
    with pytest.raises(base.WaitTimeout):
        slow.wait("slow", timeout=1)
    assert slow.delete("slow") == ["ranks of slow"]
    assert slow.status("slow").phase == "Failed"
    import os

    assert not os.path.exists(job_file)


MALFORMED = [{"event": [1]}, {"event": {"kind": "done"}}, {"event": None}, {"event": 1}, {"event": True},
             {"event": "epoch"}, {"event": "start", "lr": "fast"}, {"event": "progress", "step": [1], "steps": "x"},
             {"event": "done", "test_accuracy": "all"}, {"event": "unheard-of"}]


@pytest.mark.parametrize("event", MALFORMED, ids=lambda e: json.dumps(e))
@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_a_malformed_event_is_shown_as_output_never_a_crash(event, terminal):
    """Rank output (or a cluster log) that looks like an event but is not one the view knows: drawn as a line
    (the raw line where its kind is not even a string), and the lines after it still come."""
    from rich.console import Console

    line = "@hvdk8s " + json.dumps(event)
    shown = io.StringIO()
    logview.show([line, "the next line"], Console(file=shown, width=200, force_terminal=terminal))
    out = shown.getvalue()
    assert "the next line" in out, out
    if not isinstance(event["event"], str):
        assert events.parse(line) is None and line in out
