"""`hvdk8s logs [-f]` against the real API server's pod-log path.

What is real here: the API server, the mpi-operator that makes the launcher Job and writes the
MPIJob's status, the job controller that makes (and remakes) the launcher pod, the scheduler that binds
it to a node, and the API server's proxying of `pods/log` (follow included) to that node's kubelet
endpoint over TLS verified against the cluster's CA. What stands in for a node: kwok runs the pods on
paper, and its nodes' kubelet endpoint is `cluster_helpers.kubelet.FakeKubelet` on 127.0.0.1, which
serves each container's log from lines the test writes; the test ends the container
(`cluster_helpers.end_container`) with the exit code it needs.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from hvdk8s import events
from cluster_helpers import end_container, running_launcher, unique
from conftest import RANK_SCRIPTS, ROOT, events_of

EPOCHS = [
    {"event": "epoch", "epoch": e, "epochs": 2, "loss": 1.0 / e, "accuracy": 0.5 + e / 10, "test_loss": 0.9 / e,
     "test_accuracy": 0.45 + e / 10, "samples_per_s": 1234.0, "seconds": 0.5}
    for e in (1, 2)
]


@pytest.fixture
def kubelet(own_cluster):
    """The kubelet log endpoint of the cluster's (kwok) nodes."""
    return own_cluster.kubelet


@pytest.fixture
def launched(own_cluster, job_file, namespace):
    """A job launched in this test's namespace whose launcher fails for good the first time it exits."""
    name = unique("logs")
    run = own_cluster.cli("launch", job_file({"name": name, "kubernetes": {"namespace": namespace, "backoff_limit": 0}}))
    assert run.returncode == 0, run.stderr
    return name


def _launcher_pod(cluster, namespace: str, job: str) -> str:
    """The job's launcher pod (made by the operator's Job), once its container runs."""
    return running_launcher(cluster, namespace, job).metadata.name


def _failed_message(cluster, namespace: str, job: str) -> str:
    """The message of the MPIJob's Failed condition, as the operator wrote it."""
    from cluster_helpers import job_objects

    return next(c["message"] for c in job_objects(cluster, namespace, job)[0]["status"]["conditions"]
                if c["type"] == "Failed")


def _text(event) -> str:
    """The line the view draws for an event."""
    return events.format_text(event)


def _json(event) -> str:
    """An event as rank 0 of a rendered MPIJob prints it (HVDK8S_EVENTS=json)."""
    return "@hvdk8s " + json.dumps(event)


def test_logs_follow_the_launcher_through_the_api_server_to_the_end(own_cluster, kubelet, launched, namespace):
    name = launched
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace)  # (it waits for the launcher pod)
    pod = _launcher_pod(own_cluster, namespace, name)
    feed = kubelet.feed(namespace, pod, "launcher")
    start = {"event": "start", "job": name, "framework": "pytorch", "model": "mlp", "dataset": "digits", "ranks": 2,
             "compression": "none", "precision": "fp32", "lr": 0.1, "steps_per_epoch": 23}
    feed.write("Warning: Permanently added 'worker-0' to the list of known hosts.",
               _json(start),  # rank 0's events as the rendered MPIJob emits them (HVDK8S_EVENTS=json)
               _json({"event": "progress", "epoch": 1, "step": 5, "steps": 23, "loss": 2.1, "samples_per_s": 900.0}),
               "[0]<stdout>:" + _json(EPOCHS[0]))  # (behind horovodrun's rank tag)
    kubelet.wait_for_followers(namespace, pod, "launcher", 1)  # following now: the rest arrives live
    end_container(own_cluster, namespace, pod, 0, [
        _json(EPOCHS[1]),
        "[1,1]<stdout>:a rank's own print",
        _json({"event": "done", "test_accuracy": 0.6512, "epochs": 2, "seconds": 3.2, "digest": "ab12cd34"})])
    out, errors = follower.communicate(timeout=300)  # the operator marks the job once the launcher Job completed
    assert follower.returncode == 0, errors
    lines = out.splitlines()
    assert lines == ["Warning: Permanently added 'worker-0' to the list of known hosts.", _text(start),
                     _text(EPOCHS[0]), _text(EPOCHS[1]), "[rank 1] a rank's own print",
                     "done: test accuracy 65.12% after 2 epochs in 3.2s (parameters ab12cd34)"]
    assert "progress" not in out and "step 5/23" not in out  # progress is a bar on a terminal, nothing in a pipe
    assert f"mpijob/{name}: Succeeded" in errors
    # The API server did proxy the follow to the node's kubelet endpoint, with its client certificate.
    assert (f"/containerLogs/{namespace}/{pod}/launcher?follow=true", "kube-apiserver-kubelet-client") \
        in kubelet.requests


def test_logs_without_follow_print_what_there_is(own_cluster, kubelet, job_file, launched, namespace):
    from test_cluster_launch import NOWHERE

    stuck = unique("logs")  # a job whose workers no node takes: the operator never makes its launcher
    assert own_cluster.cli("launch", job_file({"name": stuck, "kubernetes": {"namespace": namespace,
                                                                             "node_selector": NOWHERE}})).returncode == 0
    before = own_cluster.cli("logs", stuck, "-n", namespace)
    assert before.returncode == 2, before.stderr
    assert re.search(f"mpijob {stuck} has no started launcher pod \\((Pending|Created)\\); "
                     f"`hvdk8s logs -f {stuck} -n {namespace}`", before.stderr), before.stderr
    name = launched
    pod = _launcher_pod(own_cluster, namespace, name)
    kubelet.feed(namespace, pod, "launcher").write("mpirun starting", _text(EPOCHS[0]))  # still running: not closed
    run = own_cluster.cli("logs", name, "-n", namespace)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["mpirun starting", _text(EPOCHS[0])]
    raw = own_cluster.cli("logs", name, "-n", namespace, "--raw")
    assert raw.stdout.splitlines() == ["mpirun starting", _text(EPOCHS[0])]


def test_logs_follow_a_restarted_launcher_and_exit_1_when_the_job_failed(own_cluster, kubelet, job_file, namespace):
    name = unique("logs")  # one retry: the job controller makes a second launcher pod after the first failed
    assert own_cluster.cli("launch", job_file({"name": name, "kubernetes": {"namespace": namespace,
                                                                            "backoff_limit": 1}})).returncode == 0
    first = _launcher_pod(own_cluster, namespace, name)
    kubelet.feed(namespace, first, "launcher").write("first attempt")
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace)
    kubelet.wait_for_followers(namespace, first, "launcher", 1)  # it reads the first run's log
    end_container(own_cluster, namespace, first, 1)
    second = _launcher_pod(own_cluster, namespace, name)
    assert second != first
    kubelet.feed(namespace, second, "launcher").write("second attempt")
    kubelet.wait_for_followers(namespace, second, "launcher", 1)  # ...and has come to the second pod
    end_container(own_cluster, namespace, second, 1)
    out, errors = follower.communicate(timeout=300)
    assert follower.returncode == 1, errors
    assert out.splitlines() == ["first attempt", "second attempt"]
    assert f"mpijob/{name}: Failed" in errors and _failed_message(own_cluster, namespace, name) in errors


def _ranks_output(program: list[str], tagged: bool) -> list[str]:
    """A launcher's log of two real ranks running `program` under mpirun, one of which raises: untagged as
    hvdk8s's rendered MPIJob runs them (no --tag-output; each rank's event names its rank), or each line
    tagged with its rank as horovodrun runs them."""
    from hvdk8s.launch.local import command, environment

    cmd = command(program, 2)
    if not tagged:
        cmd.remove("--tag-output")
    env = {**environment(2), "HVDK8S_EVENTS": "json"}  # as the rendered MPIJob sets it, and no launcher token
    run = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
    assert run.returncode != 0, run.stdout
    return run.stdout.splitlines()


@pytest.mark.ranks
@pytest.mark.parametrize("ranks", ["rendered", "horovodrun"])
def test_logs_of_a_failed_job_end_naming_the_rank_that_failed_first(own_cluster, kubelet, launched, namespace,
                                                                      ranks):
    """Rank 1 raised: the log (mpirun's own lines and rank 0's consequent HorovodInternalError included) is
    followed to its end, or read after the job failed, and ends with rank 1's error. The rendered job's ranks
    run the script through hvdk8s.rankmain, whose event says it; horovodrun's run a plain script, whose
    tagged traceback says it."""
    script = RANK_SCRIPTS / "raise_on_rank.py"
    rank_main = ["-m", "hvdk8s.rankmain", "--script"] if ranks == "rendered" else []  # as entrypoint.cluster_argv
    program = [sys.executable, *rank_main, str(script), "1"]
    log = _ranks_output(program, tagged=ranks == "horovodrun")
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "raise RuntimeError" in text)
    expected = f"rank 1 failed first: RuntimeError: boom on rank 1 (raise_on_rank.py:{line})"

    name = launched
    pod = _launcher_pod(own_cluster, namespace, name)
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace)
    end_container(own_cluster, namespace, pod, 1, log)
    out, errors = follower.communicate(timeout=300)
    assert follower.returncode == 1, errors
    assert errors.splitlines()[-1] == expected, out + errors
    assert "HorovodInternalError" in out  # rank 0's consequence is in the log, above
    after = own_cluster.cli("logs", name, "-n", namespace)
    assert after.returncode == 0 and after.stderr.splitlines()[-1] == expected, after.stdout + after.stderr
    records = events_of(own_cluster.cli("logs", "-f", name, "-n", namespace, "--log-format", "json").stdout)
    assert (records[-1]["event"], records[-1]["message"]) == ("exit", expected), records[-3:]  # for log stacks
