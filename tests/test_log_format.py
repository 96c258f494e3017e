"""`--log-format json`: a job's events and output as one JSON object per line, for log stacks.

Real ranks for the local launch (the digits job, and a script that prints hostile text); the real API
server's pod-log path for `hvdk8s logs -f` (the fixtures of test_cluster_logs.py); the converter itself
fuzzed with any line of text.
"""
from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import cli, events_of, invoke
from hvdk8s import events, logformat
from hvdk8s.launch import logview

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
HOSTILE = b'say "hi" \\ back\tslash \x01\x07\x1b[31mred\x7f bad \xff\xfe utf-8 \xe2\x80\xa8 end'
HOSTILE_TEXT = HOSTILE.decode("utf-8", errors="replace")  # what the launcher reads (errors="replace")


def records(stdout: str) -> list[dict]:
    """Every line of `stdout` as a JSON object with the fixed keys, in ASCII; fails on any other line (read
    by conftest.events_of, which refuses NaN and Infinity too: Python reads them, log stacks do not)."""
    found = events_of(stdout)
    for record in found:
        assert isinstance(record, dict), record
        assert TIME.match(record["time"]) and record["level"] in ("info", "warning", "error"), record
        assert isinstance(record["job"], str) and isinstance(record["event"], str), record
    assert stdout.isascii(), [line for line in stdout.split("\n") if not line.isascii()]
    assert stdout.endswith("\n") or not stdout, stdout[-200:]
    return found


def kinds(found: list[dict], kind: str) -> list[dict]:
    return [r for r in found if r["event"] == kind]


@pytest.mark.ranks
def test_a_local_launch_logs_each_event_once_per_job(job_file):
    run = cli("launch", "--local", "-np", "2", "--log-format", "json", job_file({"training": {"epochs": 2}}))
    assert run.returncode == 0, run.stdout + run.stderr
    found = records(run.stdout)
    assert {r["job"] for r in found} == {"digits-mlp"}
    assert len(kinds(found, "start")) == 1 and kinds(found, "start")[0]["ranks"] == 2  # rank 0's, not each rank's
    assert [r["epoch"] for r in kinds(found, "epoch")] == [1, 2]
    assert len(kinds(found, "done")) == 1 and kinds(found, "done")[0]["test_accuracy"] > 0.5
    assert found[-1]["event"] == "exit" and found[-1]["code"] == 0 and found[-1]["status"] == "Succeeded"
    assert "done: test accuracy" not in run.stdout  # no progress view


SCRIPT = f"""\
import sys, traceback
sys.stdout.buffer.write({HOSTILE!r} + b"\\n")
sys.stdout.flush()
print("a warning of its own", file=sys.stderr, flush=True)
try:
    raise KeyError("boom")
except KeyError:
    traceback.print_exc()
sys.stderr.flush()
"""


@pytest.mark.ranks
def test_a_scripts_hostile_output_stays_one_valid_json_line(tmp_path):
    (tmp_path / "hostile.py").write_text(SCRIPT)
    (tmp_path / "job.yaml").write_text("name: hostile\nframework: pytorch\nentrypoint: {script: hostile.py}\n"
                                      "training: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n")
    run = cli("launch", "--local", "-np", "2", "--log-format", "json", tmp_path / "job.yaml", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = records(run.stdout)
    said = [r for r in kinds(found, "output") if r["message"] == HOSTILE_TEXT]
    assert sorted(r["rank"] for r in said) == [0, 1] and {r["level"] for r in said} == {"info"}, run.stdout
    warned = [r for r in kinds(found, "output") if r["message"] == "a warning of its own"]
    assert {r["level"] for r in warned} == {"warning"}  # the rank's stderr, as mpirun's tag says
    trace = [r for r in kinds(found, "output") if r.get("rank") == 0 and r["level"] == "error"]
    assert trace[0]["message"].startswith("Traceback") and trace[-1]["message"] == "KeyError: 'boom'", trace
    assert found[-1]["event"] == "exit" and found[-1]["code"] == 0


# --- a cluster job's log through the real API server (test_cluster_logs.py's fixtures) ----------------------

from test_cluster_logs import (EPOCHS, _failed_message, _json, _launcher_pod, kubelet,  # noqa: E402,F401
                               launched)  # (fixtures)


def test_logs_follow_as_json_lines(own_cluster, kubelet, launched, namespace):  # noqa: F811
    from cluster_helpers import end_container

    name = launched
    pod = _launcher_pod(own_cluster, namespace, name)
    feed = kubelet.feed(namespace, pod, "launcher")
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace, "--log-format", "json")
    start = {"event": "start", "job": name, "framework": "pytorch", "model": "mlp", "dataset": "digits",
             "ranks": 2, "compression": "none", "precision": "fp32", "lr": 0.1, "steps_per_epoch": 23}
    feed.write(
        "Warning: Permanently added 'worker-0' to the list of known hosts.", _json(start), _json(EPOCHS[0]),
        _json(EPOCHS[1]), HOSTILE_TEXT,
        _json({"event": "done", "test_accuracy": 0.6512, "epochs": 2, "seconds": 3.2, "digest": "ab12cd34"}))
    kubelet.wait_for_followers(namespace, pod, "launcher", 1)  # it follows the log before the log ends
    end_container(own_cluster, namespace, pod, 0)
    out, errors = follower.communicate(timeout=300)
    assert follower.returncode == 0, errors
    found = records(out)
    assert [r["event"] for r in found] == ["output", "start", "epoch", "epoch", "output", "done", "exit"], out
    assert {r["job"] for r in found} == {name}
    assert found[1]["steps_per_epoch"] == 23 and [r["epoch"] for r in found[2:4]] == [1, 2]  # read back field for field
    assert found[4]["message"] == HOSTILE_TEXT and "rank" not in found[4]  # the cluster's mpirun tags no ranks
    assert found[-1]["code"] == 0 and found[-1]["status"] == "Succeeded"
    assert "Succeeded" not in errors  # the exit record says it; stderr is for errors


def test_launch_wait_logs_the_phases_and_how_the_job_ended(own_cluster, job_file, namespace):
    from cluster_helpers import end_launcher, unique

    name = unique("digits")
    launching = own_cluster.popen("launch", job_file({"name": name, "kubernetes": {"namespace": namespace,
                                                                                   "backoff_limit": 0}}),
                                  "--wait", "--log-format", "json")
    submitted = json.loads(launching.stdout.readline())  # the job exists once this is written
    assert (submitted["event"], submitted["job"], submitted["namespace"]) == ("submitted", name, namespace)
    end_launcher(own_cluster, namespace, name, 1)
    out, errors = launching.communicate(timeout=300)
    assert launching.returncode == 1, errors
    found = records(out)
    assert {r["event"] for r in found} == {"phase", "exit"} and "Failed" in [r["phase"] for r in found[:-1]]
    assert (found[-1]["code"], found[-1]["status"], found[-1]["level"]) == (1, "Failed", "error")
    assert _failed_message(own_cluster, namespace, name) in found[-1]["message"]


def test_logs_refuse_raw_with_json():
    run = invoke("logs", "x", "--raw", "--log-format", "json")
    assert run.exit_code == 2 and "--raw, --log-format json: one at a time" in run.stderr


# --- the converter ----------------------------------------------------------------------------------------

def convert(*lines: str) -> list[dict]:
    out = io.StringIO()
    logview.draw(lines, logformat.JsonLog("j", out))
    text = out.getvalue()
    assert text.count("\n") == len(lines), text  # one line per line in
    return records(text)


def test_non_finite_numbers_are_null_and_fields_never_relabel_the_record():
    nan_epoch = {**EPOCHS[0], "loss": float("nan"), "level": "debug", "time": "then", "job": "other"}
    [record] = convert("@hvdk8s " + json.dumps(nan_epoch))
    assert record["loss"] is None and record["level"] == "info" and record["job"] == "j" and record["time"] != "then"


def test_an_elastic_event_keeps_its_fields_and_its_text_is_output():
    event = {"event": "elastic", "ranks": 3, "epoch": 2, "unread": 40}
    [record] = convert("@hvdk8s " + json.dumps(event))
    assert (record["event"], record["ranks"], record["epoch"], record["unread"]) == ("elastic", 3, 2, 40)
    [record] = convert(events.format_text(event))  # a hand-run job's text for people is its output
    assert record["event"] == "output" and record["message"] == events.format_text(event)


_event_like = st.dictionaries(st.text(max_size=8), st.none() | st.booleans() | st.integers() | st.floats()
                              | st.text(max_size=20), max_size=4)
_lines = st.one_of(
    st.text(),
    st.lists(st.characters() | st.sampled_from(["\ud800", "\udfff", "\u2028", "\x85", "\x00", "\r"]))
    .map("".join),
    st.builds(lambda tag, body: tag + body, st.sampled_from(["[1,0]<stdout>:", "[0]<stderr>:", "[1,12]<stdout>:"]),
              st.text()),
    st.builds(lambda kind, fields: "@hvdk8s " + json.dumps({**fields, "event": kind}), st.text(max_size=10),
              _event_like),
    st.sampled_from(["@hvdk8s {\"event\": \"x\", \"n\": " + "9" * 5000 + "}",  # past Python's int digit limit
                     "@hvdk8s " + "[" * 100_000, "@hvdk8s {\"event\": \"x\", \"d\": " + "[" * 900 + "]" * 900 + "}",
                     "Traceback (most recent call last):", "done: test accuracy nan% after 1 epochs in infs "
                     "(parameters x)", *(events.format_text(e) for e in EPOCHS)]),
)


@settings(max_examples=400, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(line=_lines)
def test_any_line_converts_to_exactly_one_json_line(line):
    [record] = convert(line)
    assert record["job"] == "j" and record["event"] != "exit"  # only the launcher ends a job's log
    if record["event"] == "output":
        assert isinstance(record["message"], str)


@pytest.mark.parametrize("kind", ["output", "exit"])
def test_a_ranks_event_of_the_logs_own_kind_is_logged_as_its_output(kind):
    line = "@hvdk8s " + json.dumps({"event": kind, "code": 0})
    [record] = convert(line)
    assert record["event"] == "output" and json.loads(record["message"][len("@hvdk8s "):]) == json.loads(line[8:])


def test_a_line_mpirun_tagged_in_pieces_is_read_as_the_rank_wrote_it():
    """mpirun tags each piece it reads from a rank: a traceback written in several writes came back as
    below in a CI run (2026-12-05), and the failing rank went unnamed."""
    from hvdk8s.failures import FirstFailure

    output = ['[1,1]<stderr>:Traceback (most recent call last):',
              '[1,1]<stderr>:  File "/w/tests/ranks/raise_on_rank.py", line 11, in <module>',
              '[1,1]<stderr>:    raise RuntimeError(f"boom on rank {hvd.rank()}")[1,1]<stderr>:',
              '[1,1]<stderr>:RuntimeError[1,1]<stderr>:: boom on rank 1',
              '[1,0]<stderr>:Traceback (most recent call last):',
              '[1,0]<stderr>:  File "/w/tests/ranks/raise_on_rank.py", line 12, in <module>',
              '[1,0]<stderr>:    hvd.allreduce(torch.ones(1), name="then")',
              '[1,0]<stderr>:horovod.common.exceptions.HorovodInternalError: Horovod has been shut down.']
    assert logformat.split_tag(output[3]) == (1, "stderr", "RuntimeError: boom on rank 1")
    assert logformat.split_tag(output[2])[2] == '    raise RuntimeError(f"boom on rank {hvd.rank()}")'
    reader = FirstFailure()
    for line in output:
        reader.feed(line)
    assert reader.first().summary() == "rank 1 failed first: RuntimeError: boom on rank 1 (raise_on_rank.py:11)"
