"""`hvdk8s logs [-f]` against the real API server's pod-log path.

What is real here: the API server, the launcher Pod object (labelled as mpi-operator labels it, bound
to a Node), and the API server's proxying of `pods/log` (follow included) to that Node's kubelet
endpoint over TLS verified against the cluster's CA. What stands in for a node: the Node object
points at `cluster_helpers.kubelet.FakeKubelet` on 127.0.0.1, which serves the container's log from
lines the test writes; the launcher container's state and the MPIJob's status are written by the test
(there is no kubelet or mpi-operator in the project's cluster).
"""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time

import pytest

from cluster_helpers import Operator, unique
from cluster_helpers.kubelet import FakeKubelet
from conftest import RANK_SCRIPTS, ROOT

EPOCHS = [
    {"event": "epoch", "epoch": e, "epochs": 2, "loss": 1.0 / e, "accuracy": 0.5 + e / 10, "test_loss": 0.9 / e,
     "test_accuracy": 0.45 + e / 10, "samples_per_s": 1234.0, "seconds": 0.5}
    for e in (1, 2)
]


@pytest.fixture
def kubelet(own_cluster):
    """A Node whose kubelet endpoint is a FakeKubelet on 127.0.0.1 (removed after the test)."""
    from kubernetes import client

    server = FakeKubelet(own_cluster.state / "certs")
    core = client.CoreV1Api(own_cluster.api())
    node = unique("node")
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    core.patch_node_status(node, {"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": server.port}}}})
    server.node = node
    yield server
    server.close()
    core.delete_node(node)


@pytest.fixture
def launched(own_cluster, job_file, namespace):
    name = unique("logs")
    run = own_cluster.cli("launch", job_file({"name": name, "kubernetes": {"namespace": namespace}}))
    assert run.returncode == 0, run.stderr
    return name


def _launcher_pod(cluster, kubelet, namespace: str, job: str, restarts: int = 0, pod: str | None = None) -> str:
    """The launcher Pod as the operator's batch Job would make it, on the fake node, its container started."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    pod = pod or f"{job}-launcher-{unique('x')[-5:]}"
    if restarts == 0:
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "labels": {"training.kubeflow.org/job-name": job,
                                                 "training.kubeflow.org/job-role": "launcher",
                                                 "training.kubeflow.org/operator-name": "mpi-operator"}},
            "spec": {"nodeName": kubelet.node, "restartPolicy": "OnFailure",
                     "containers": [{"name": "launcher", "image": "hvdk8s:test"}]}})
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(pod, namespace, {"status": {"phase": "Running", "containerStatuses": [{
        "name": "launcher", "ready": True, "restartCount": restarts, "image": "hvdk8s:test", "imageID": "",
        "state": {"running": {"startedAt": now}}}]}})
    return pod


def _text(event) -> str:
    from hvdk8s.events import format_text

    return format_text(event)


def test_logs_follow_the_launcher_through_the_api_server_to_the_end(own_cluster, kubelet, launched, namespace):
    import json

    name = launched
    operator = Operator(own_cluster.api(), namespace, name)
    operator.created()
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace)
    time.sleep(2)  # logs -f waits for a launcher pod: none yet
    pod = _launcher_pod(own_cluster, kubelet, namespace, name)
    operator.running()
    feed = kubelet.feed(namespace, pod, "launcher")
    start = {"event": "start", "job": name, "framework": "pytorch", "model": "mlp", "dataset": "digits", "ranks": 2,
             "compression": "none", "precision": "fp32", "lr": 0.1, "steps_per_epoch": 23}
    feed.write("Warning: Permanently added 'worker-0' to the list of known hosts.",
               _text(start),  # rank 0's events as the rendered MPIJob emits them today (HVDK8S_EVENTS=text)
               _text({"event": "progress", "epoch": 1, "step": 5, "steps": 23, "loss": 2.1, "samples_per_s": 900.0}),
               _text(EPOCHS[0]))
    kubelet.wait_for_followers(namespace, pod, "launcher", 1)  # following now: the rest arrives live
    feed.write("@hvdk8s " + json.dumps(EPOCHS[1]),  # ...or as JSON (HVDK8S_EVENTS=json)
               "[1,1]<stdout>:a rank's own print",
               _text({"event": "done", "test_accuracy": 0.6512, "epochs": 2, "seconds": 3.2, "digest": "ab12cd34"}))
    feed.close()  # the launcher container exits...
    operator.succeeded()  # ...and the operator marks the job
    out, errors = follower.communicate(timeout=90)
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


def test_logs_without_follow_print_what_there_is(own_cluster, kubelet, launched, namespace):
    name = launched
    before = own_cluster.cli("logs", name, "-n", namespace)
    assert before.returncode == 2 and f"mpijob {name} has no started launcher pod (Pending); `hvdk8s logs -f {name} -n {namespace}`" \
        in before.stderr
    pod = _launcher_pod(own_cluster, kubelet, namespace, name)
    kubelet.feed(namespace, pod, "launcher").write("mpirun starting", _text(EPOCHS[0]))  # still running: not closed
    run = own_cluster.cli("logs", name, "-n", namespace)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["mpirun starting", _text(EPOCHS[0])]
    raw = own_cluster.cli("logs", name, "-n", namespace, "--raw")
    assert raw.stdout.splitlines() == ["mpirun starting", _text(EPOCHS[0])]


def test_logs_follow_a_restarted_launcher_and_exit_1_when_the_job_failed(own_cluster, kubelet, launched, namespace):
    name = launched
    operator = Operator(own_cluster.api(), namespace, name)
    pod = _launcher_pod(own_cluster, kubelet, namespace, name)
    operator.running()
    first = kubelet.feed(namespace, pod, "launcher")
    first.write("first attempt")
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace)
    kubelet.wait_for_followers(namespace, pod, "launcher", 1)  # it reads the first run's log
    first.close()  # the container failed; restartPolicy OnFailure restarts it in the same pod
    kubelet.feeds[(namespace, pod, "launcher")] = second = type(first)()
    second.write("second attempt")
    _launcher_pod(own_cluster, kubelet, namespace, name, restarts=1, pod=pod)
    kubelet.wait_for_followers(namespace, pod, "launcher", 2)  # ...and has come back for the restarted one
    second.close()
    operator.failed(f"MPIJob {namespace}/{name} has failed because 1 Launcher replica(s) failed.")
    out, errors = follower.communicate(timeout=90)
    assert follower.returncode == 1, errors
    assert out.splitlines() == ["first attempt", "second attempt"]
    assert f"mpijob/{name}: Failed" in errors and "1 Launcher replica(s) failed" in errors


def _ranks_output(program: list[str], tagged: bool) -> list[str]:
    """A launcher's log of two real ranks running `program` under mpirun, one of which raises: untagged as
    hvdk8s's rendered MPIJob runs them (no --tag-output; each rank's event names its rank), or each line
    tagged with its rank as horovodrun runs them."""
    from hvdk8s.launch.local import command, environment

    cmd = command(program, 2)
    if not tagged:
        cmd.remove("--tag-output")
    env = {**environment(2), "HVDK8S_EVENTS": "text"}  # as the rendered MPIJob sets it, and no launcher token
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
    operator = Operator(own_cluster.api(), namespace, name)
    pod = _launcher_pod(own_cluster, kubelet, namespace, name)
    operator.running()
    follower = own_cluster.popen("logs", "-f", name, "-n", namespace)
    feed = kubelet.feed(namespace, pod, "launcher")
    feed.write(*log)
    feed.close()
    operator.failed(f"MPIJob {namespace}/{name} has failed because 1 Launcher replica(s) failed.")
    out, errors = follower.communicate(timeout=90)
    assert follower.returncode == 1, errors
    assert errors.splitlines()[-1] == expected, out + errors
    assert "HorovodInternalError" in out  # rank 0's consequence is in the log, above
    after = own_cluster.cli("logs", name, "-n", namespace)
    assert after.returncode == 0 and after.stderr.splitlines()[-1] == expected, after.stdout + after.stderr
    records = own_cluster.cli("logs", "-f", name, "-n", namespace, "--log-format", "json").stdout.splitlines()
    assert json.loads(records[-1])["message"] == expected, records[-3:]  # the exit record says it for log stacks
