"""`hvdk8s launch` (cluster), status, wait, list, delete against a real Kubernetes API server.

The cluster is real (the project's own Kubernetes 1.35 with the real mpi-operator on 127.0.0.1, or the
cluster HVDK8S_TEST_KUBECONFIG names): the operator moves every job. On the project's cluster the pods
run on kwok's nodes, and a test ends the launcher's container with the exit code it needs
(`cluster_helpers.end_launcher`); the operator then writes how the job ended.
"""
from __future__ import annotations

import datetime
import json
import re
import threading
import time

import pytest
import yaml

from cluster_helpers import GROUP, PLURAL, VERSION, end_launcher, unique, wait_phase
from cluster_helpers import job_objects as _objects

UNDONE = "(Pending|Created|Running)"  # the phases of a job that has not ended (how far the operator got)


@pytest.fixture
def job(job_file, namespace):
    """A digits job file for this test's namespace; returns (path, name)."""
    name = unique("digits")
    return job_file({"name": name, "kubernetes": {"namespace": namespace}}), name


def _served_spec_schema(cluster) -> dict:
    crd = json.loads(cluster.kubectl("get", "crd", f"{PLURAL}.{GROUP}", "-o", "json").stdout)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _without_crd_defaults(created, sent, schema):
    """`created` less the fields `sent` lacked that hold exactly the schema's default (any other extra stays,
    and fails the comparison)."""
    if not isinstance(created, dict) or not isinstance(sent, dict):
        return created
    props = (schema or {}).get("properties") or {}
    kept = {}
    for key, value in created.items():
        if key not in sent and "default" in (props.get(key) or {}) and props[key]["default"] == value:
            continue
        kept[key] = _without_crd_defaults(value, sent.get(key), props.get(key)) if key in sent else value
    return kept


def _rendered(path):
    from hvdk8s.entrypoint import carried_files
    from hvdk8s.mpijob.render import render
    from hvdk8s.spec import load_job

    spec = load_job(path)
    return render(spec, carried_files(spec, path.parent, str(path)))


def test_launch_creates_exactly_the_rendered_objects(cluster, job, namespace):
    path, name = job
    run = cluster.cli("launch", path)
    assert run.returncode == 0, run.stderr
    assert f"created mpijob/{name} and configmap/{name}-job in namespace {namespace}" in run.stdout
    created_job, created_cm = _objects(cluster, namespace, name)
    rendered_cm, rendered_job = _rendered(path)
    # The MPIJob as sent, plus only what the served CRD's schema defaults.
    assert _without_crd_defaults(created_job["spec"], rendered_job["spec"], _served_spec_schema(cluster)) \
        == rendered_job["spec"]
    assert created_job["metadata"]["labels"] == rendered_job["metadata"]["labels"]
    assert created_cm["data"] == rendered_cm["data"]
    assert created_cm["metadata"]["labels"] == rendered_cm["metadata"]["labels"]
    # ...and the ConfigMap belongs to the MPIJob, so that deleting the job deletes it.
    assert created_cm["metadata"]["ownerReferences"] == [{
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "MPIJob", "name": name,
        "uid": created_job["metadata"]["uid"], "controller": True}]


def test_a_second_launch_of_a_job_is_refused_and_changes_nothing(cluster, job, namespace):
    path, name = job
    assert cluster.cli("launch", path).returncode == 0
    before = _objects(cluster, namespace, name)
    again = cluster.cli("launch", path, "--set", "training.epochs=3")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert re.search(f"mpijob {name} already exists in namespace {namespace} \\({UNDONE}", again.stderr), again.stderr
    assert f"hvdk8s delete {name} -n {namespace}" in again.stderr
    after = _objects(cluster, namespace, name)
    # The operator writes the MPIJob's status meanwhile: the spec (its generation) and the ConfigMap stay.
    assert after[0]["metadata"]["generation"] == before[0]["metadata"]["generation"]
    assert after[0]["spec"] == before[0]["spec"]
    assert after[1]["metadata"]["resourceVersion"] == before[1]["metadata"]["resourceVersion"]


def test_status_and_wait_follow_created_running_succeeded(own_cluster, job, namespace):
    path, name = job
    assert own_cluster.cli("launch", path).returncode == 0
    waiting = own_cluster.popen("wait", name, "-n", namespace, "--timeout", "300s")
    first = waiting.stderr.readline()  # the wait has read the job (and then watches it)
    assert re.match(f"mpijob/{name}: {UNDONE}", first), first
    running = wait_phase(own_cluster, namespace, name, "Running")
    assert running["replicaStatuses"]["Launcher"]["active"] == 1
    shown = own_cluster.cli("status", name, "-n", namespace)
    assert "phase:      Running" in shown.stdout and "Launcher 1 active; Worker 1 active" in shown.stdout
    assert "MPIJobRunning" in shown.stdout
    end_launcher(own_cluster, namespace, name, 0)
    out, errors = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, errors
    order = [errors.find(f"mpijob/{name}: {p}") for p in ("Running", "Succeeded")]
    assert -1 not in order and order == sorted(order), errors
    final = json.loads(own_cluster.cli("status", name, "-n", namespace, "-o", "json").stdout)
    assert final["phase"] == "Succeeded" and final["replicaStatuses"]["Launcher"]["succeeded"] == 1


# A launcher's log in which rank 1 raised (mpirun tags each rank's lines), and the line hvdk8s names it by.
FAILED_LOG = ["[1,1]<stderr>:Traceback (most recent call last):",
              '[1,1]<stderr>:  File "/etc/hvdk8s/train.py", line 7, in <module>',
              "[1,1]<stderr>:RuntimeError: boom on rank 1",
              "mpirun detected that one or more processes exited with non-zero status"]
FAILED_FIRST = "rank 1 failed first: RuntimeError: boom on rank 1 (train.py:7)"


def test_wait_exits_1_with_the_operators_message_when_the_job_failed(own_cluster, job_file, namespace):
    """...and ends naming the rank that failed first, read from the failed launcher pod's log (the Job keeps
    the pod: restartPolicy Never)."""
    name = unique("digits")
    path = job_file({"name": name, "kubernetes": {"namespace": namespace, "backoff_limit": 0}})
    assert own_cluster.cli("launch", path).returncode == 0
    end_launcher(own_cluster, namespace, name, 1, FAILED_LOG)
    run = own_cluster.cli("wait", name, "-n", namespace, "-o", "yaml", "--timeout", "300s")
    assert run.returncode == 1, run.stderr
    final = yaml.safe_load(run.stdout)
    assert final["phase"] == "Failed" and final["replicaStatuses"]["Launcher"]["failed"] == 1
    assert run.stderr.splitlines() == [FAILED_FIRST], run.stderr  # -o: the document on stdout, the cause on stderr
    job = _objects(own_cluster, namespace, name)[0]
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    status = own_cluster.cli("status", name, "-n", namespace)
    assert f"phase:      Failed: {failed['message']}" in status.stdout, (status.stdout, failed)
    again = own_cluster.cli("wait", name, "-n", namespace)  # a job that has ended: said at once
    phase, cause = again.stderr.splitlines()[-2:]
    assert again.returncode == 1 and phase.startswith(f"mpijob/{name}: Failed (") and cause == FAILED_FIRST, \
        again.stderr


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_launch_wait_exits_as_the_job_ended(own_cluster, job_file, namespace, outcome):
    name = unique("digits")
    path = job_file({"name": name, "kubernetes": {"namespace": namespace, "backoff_limit": 0}})
    code, log = (0, ["done"]) if outcome == "succeeded" else (1, FAILED_LOG)
    ender = threading.Thread(target=end_launcher, args=(own_cluster, namespace, name, code, log))
    ender.start()
    run = own_cluster.cli("launch", path, "--wait", "--timeout", "300s", timeout=600)
    ender.join()
    assert run.returncode == code, run.stdout + run.stderr
    last = run.stderr.splitlines()[-1]
    if outcome == "succeeded":
        assert last.startswith(f"mpijob/{name}: Succeeded") and "failed first" not in run.stderr, run.stderr
    else:  # the cause, as `hvdk8s logs` ends, below the phase
        assert f"mpijob/{name}: Failed" in run.stderr and last == FAILED_FIRST, run.stderr


NOWHERE = {"hvdk8s.test/no-such-node": "true"}  # a node selector no node matches: the workers stay Pending


@pytest.mark.parametrize("verb", ["wait", "launch --wait"])
def test_a_wait_that_times_out_says_so_and_leaves_the_job(cluster, job_file, namespace, verb):
    name = unique("digits")
    path = job_file({"name": name, "kubernetes": {"namespace": namespace, "node_selector": NOWHERE}})
    if verb == "wait":
        assert cluster.cli("launch", path).returncode == 0
        args = ("wait", name, "-n", namespace)
    else:
        args = ("launch", path, "--wait")
    run = cluster.cli(*args, "--timeout", "2s")
    assert run.returncode == 2 and "Traceback" not in run.stderr  # as every wait that ran out: exit 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == run.stderr.strip().splitlines()[-1:], run.stderr  # one line, the last
    assert re.search(f"mpijob {name} is still (Pending|Created) after 2s \\(it goes on running\\); wait longer",
                     errors[0]), errors[0]
    assert _objects(cluster, namespace, name)[0] is not None


def test_delete_removes_what_launch_made(cluster, job, namespace):
    path, name = job
    launched = cluster.cli("launch", path, "-o", "json")
    assert json.loads(launched.stdout)["created"] == [f"mpijob/{name}", f"configmap/{name}-job"]
    run = cluster.cli("delete", name, "-n", namespace)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == [f"deleted mpijob/{name}", f"deleted configmap/{name}-job"]
    assert _objects(cluster, namespace, name) == (None, None)
    again = cluster.cli("delete", name, "-n", namespace)
    assert again.returncode == 2 and f"no mpijob {name} in namespace {namespace}" in again.stderr


def test_list_shows_the_jobs_of_a_namespace(own_cluster, job_file, namespace):
    names = [unique("a"), unique("b")]
    for name, extra in zip(names, ({"node_selector": NOWHERE}, {})):
        path = job_file({"name": name, "kubernetes": {"namespace": namespace, **extra}}, name=f"{name}.yaml")
        assert own_cluster.cli("launch", path).returncode == 0
    wait_phase(own_cluster, namespace, names[0], "Created")  # its workers cannot be placed
    wait_phase(own_cluster, namespace, names[1], "Running")
    run = own_cluster.cli("list", "-n", namespace)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.strip().splitlines()]
    assert rows[0] == ["NAME", "PHASE", "WORKERS", "AGE"]
    assert [r[:3] for r in rows[1:]] == [[names[0], "Created", "1"], [names[1], "Running", "1"]]
    listed = json.loads(own_cluster.cli("list", "-A", "-o", "json").stdout)
    assert {(j["namespace"], j["name"]) for j in listed} >= {(namespace, n) for n in names}


def test_dry_run_prints_what_would_be_sent_and_sends_nothing(cluster, job, namespace):
    path, name = job
    run = cluster.cli("launch", path, "--dry-run")
    assert run.returncode == 0, run.stderr
    sent = [d for d in yaml.safe_load_all(run.stdout) if d]
    rendered_cm, rendered_job = _rendered(path)
    assert sent == [rendered_job, rendered_cm]  # the MPIJob first: the ConfigMap is owned by it
    assert json.loads(cluster.cli("launch", path, "--dry-run", "-o", "json").stdout) == sent
    assert _objects(cluster, namespace, name) == (None, None)


def test_the_namespace_comes_from_the_flag_or_the_context(cluster, job_file, namespace):
    name = unique("ns")
    path = job_file({"name": name})  # the job file names no namespace
    run = cluster.cli("launch", path, "-n", namespace)
    assert run.returncode == 0, run.stderr
    _, cm = _objects(cluster, namespace, name)
    assert yaml.safe_load(cm["data"]["job.yaml"])["kubernetes"]["namespace"] == namespace  # what the ranks read
    # A job file and a flag that disagree are refused, as kubectl refuses them.
    other = job_file({"name": name, "kubernetes": {"namespace": "elsewhere"}}, name="other.yaml")
    clash = cluster.cli("launch", other, "-n", namespace)
    assert clash.returncode == 2 and "the job file says namespace elsewhere, --namespace says" in clash.stderr


def test_a_missing_namespace_is_named_and_nothing_is_created(cluster, job_file):
    name, missing = unique("lost"), unique("no-such-ns")
    run = cluster.cli("launch", job_file({"name": name, "kubernetes": {"namespace": missing}}))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"namespace {missing} does not exist" in run.stderr and f"kubectl create namespace {missing}" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    listed = json.loads(cluster.cli("list", "-A", "-o", "json").stdout)
    assert name not in {j["name"] for j in listed}


def test_status_says_how_old_the_job_is(cluster, job, namespace):
    path, name = job
    assert cluster.cli("launch", path).returncode == 0
    created = _objects(cluster, namespace, name)[0]["metadata"]["creationTimestamp"]
    since = datetime.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    while True:  # until the age is one the clock can tell from 0s
        before = time.time()
        shown = cluster.cli("status", name, "-n", namespace)
        after = time.time()
        assert shown.returncode == 0, shown.stderr
        age = next(line for line in shown.stdout.splitlines() if line.lstrip().startswith("age:"))
        seconds, rest = age.split()[1], " ".join(age.split()[2:])
        assert rest == f"(created {created})"  # the server's creationTimestamp, as it gave it
        assert seconds.endswith("s"), age
        if int(seconds[:-1]) >= 2:
            break
    # Now minus the creation time, in whole seconds (the timestamp has no fraction): within the call.
    assert int(before - since) - 1 <= int(seconds[:-1]) <= int(after - since) + 1, (age, before - since, after - since)


def test_status_of_an_unknown_job_says_where_it_looked(cluster, namespace):
    run = cluster.cli("status", "nosuch", "-n", namespace)
    assert run.returncode == 2
    assert f"no mpijob nosuch in namespace {namespace}; `hvdk8s list -n {namespace}`" in run.stderr
