"""What a run writes into its run directory with `observability.timeline`, `.autotune` and `.tensorboard`
on: real 2-rank launches (one per framework), the files read back with their own readers (json for
the Chrome trace, TensorBoard's EventAccumulator)."""
from __future__ import annotations

import csv
import json
import math
import sys
import types
from pathlib import Path

import pytest
import yaml

from conftest import DIGITS_JOB, cli, events_of
from hvdk8s import events as rank_events
from hvdk8s.tensorboard import Scalars

EPOCHS = 3
SCALARS = {"loss": "epoch/loss", "accuracy": "epoch/accuracy", "test_loss": "epoch/test_loss",
           "test_accuracy": "epoch/test_accuracy", "samples_per_s": "epoch/samples_per_s"}


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} as TensorBoard reads the directory."""
    # TensorBoard reads files through TensorFlow's gfile when TensorFlow is installed (seconds to import)
    # and else through its own stub; its TensorFlow-free build picks the stub by this module's presence.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(s.step, s.value) for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def launch(tmp: Path, framework: str, **switches: bool):
    """A 2-rank digits run with `switches` on, writing into tmp/run/here (a folder that does not exist yet)."""
    data = yaml.safe_load(DIGITS_JOB.read_text())
    data["framework"] = framework
    data["training"].update(epochs=EPOCHS, warmup_epochs=2)  # epoch 1 ends inside the warm-up
    run_dir = tmp / "run" / "here"
    data["observability"] = {"dir": str(run_dir), **switches}
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    proc = cli("launch", "--local", "-np", "2", "--log-format", "json", job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir, [e for e in events_of(proc.stdout) if e["event"] not in ("output", "exit")]


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("torch"), "pytorch", timeline=True, autotune=True, tensorboard=True)


def check_epoch_scalars(run_dir: Path, events: list[dict]) -> None:
    """One point per epoch per figure, the epoch events' values (TensorBoard keeps them as float32); the rate
    is the warm-up's, then the peak."""
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1))
    found = scalars(run_dir / "tensorboard")
    for field, tag in SCALARS.items():
        assert [s for s, _ in found[tag]] == list(range(1, EPOCHS + 1)), tag
        for (_, value), event in zip(found[tag], epochs):
            assert math.isclose(value, event[field], rel_tol=1e-6), (tag, value, event)
    peak = 0.05 * 2  # learning_rate x 2 ranks (lr_scaling linear)
    rates = [v for _, v in found["epoch/learning_rate"]]
    assert rates[0] == pytest.approx(0.05 + (peak - 0.05) / 2) and rates[1:] == pytest.approx([peak] * 2)


@pytest.mark.ranks
def test_tensorboard_has_each_epochs_figures(torch_run):
    run_dir, events = torch_run
    check_epoch_scalars(run_dir, events)
    assert len(list((run_dir / "tensorboard").iterdir())) == 1  # rank 0's file only


@pytest.mark.ranks
def test_the_timeline_is_a_chrome_trace_of_both_ranks_allreduces(torch_run):
    run_dir, _ = torch_run
    with open(run_dir / "horovod-timeline.json") as f:
        trace = json.load(f)
    assert isinstance(trace, list)
    # Horovod draws each tensor as a process: its name on a metadata event, then its phases.
    tensors = {e["pid"]: e["args"]["name"] for e in trace if e.get("ph") == "M" and e["name"] == "process_name"
               and "name" in e["args"]}
    phases = {}
    for e in trace:
        if e.get("ph") in ("B", "X") and e["pid"] in tensors:
            phases.setdefault(tensors[e["pid"]], set()).add(e["name"])
    reduced = [t for t in tensors.values() if t.startswith("allreduce.")]  # gradients, the epoch's figures
    assert len(reduced) > 1 and "allreduce.hvdk8s.train_metrics" in reduced, sorted(tensors.values())
    for tensor in reduced:
        # Negotiation: both ranks report the tensor ready (an event named after each rank); then the reduction.
        assert {"NEGOTIATE_ALLREDUCE", "0", "1", "ALLREDUCE"} <= phases[tensor], (tensor, phases[tensor])


@pytest.mark.ranks
def test_the_autotune_log_and_the_pointers(torch_run):
    run_dir, events = torch_run
    with open(run_dir / "horovod-autotune.csv", newline="") as f:
        header = next(csv.reader(f))
    assert "tensor_fusion_threshold" in header and "cycle_time_ms" in header and header[-1] == "score"
    files = {e["what"]: e["path"] for e in events if e["event"] == "file"}
    assert files == {"timeline": str(run_dir / "horovod-timeline.json"),
                     "autotune": str(run_dir / "horovod-autotune.csv"), "tensorboard": str(run_dir / "tensorboard")}
    [timeline] = [e for e in events if e["event"] == "file" and e["what"] == "timeline"]
    assert rank_events.format_text(timeline) == \
        f"timeline: {files['timeline']} (open in chrome://tracing or https://ui.perfetto.dev)"  # the view's line
    assert [e["event"] for e in events[-4:]] == ["done", "file", "file", "file"]  # the pointers come last


# A Keras run's scalars: tests/test_metrics.py's TensorFlow launch (metrics and TensorBoard in one run).


def test_progress_reports_are_steps_and_a_resume_adds_to_the_run(tmp_path):
    # The launches' epochs are too short for a progress report (at most one a second): the sink, fed here.
    first = Scalars(str(tmp_path))
    first({"event": "progress", "epoch": 1, "step": 5, "steps": 10, "loss": 2.5, "samples_per_s": 100.0})
    first({"event": "progress", "epoch": 2, "step": 3, "steps": 10, "loss": 1.5, "samples_per_s": 120.0})
    first({"event": "epoch", "epoch": 1, "loss": 2.0, "accuracy": 0.5, "test_loss": 2.1, "test_accuracy": 0.4,
           "samples_per_s": 110.0, "lr": 0.1, "seconds": 1.0, "epochs": 3})
    first({"event": "done"})  # not a figure
    first.close()
    resumed = Scalars(str(tmp_path))
    resumed({"event": "epoch", "epoch": 2, "loss": 1.0, "accuracy": 0.75, "test_loss": 1.1, "test_accuracy": 0.7,
             "samples_per_s": 115.0, "lr": 0.1, "seconds": 1.0, "epochs": 3})
    resumed.close()
    found = scalars(tmp_path)
    assert found["step/loss"] == [(5, 2.5), (13, 1.5)] and found["step/samples_per_s"] == [(5, 100.0), (13, 120.0)]
    assert found["epoch/accuracy"] == [(1, 0.5), (2, 0.75)]
    assert found["epoch/learning_rate"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.1))]
    assert len(list(tmp_path.iterdir())) == 2  # one file per run: TensorBoard reads them as one run
