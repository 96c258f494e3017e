"""`hvdk8s validate` judges MPIJobs as the cluster does, checked against the judges themselves: each case is the
CPU golden MPIJob with one change, created on the project's cluster. The API server (the operator's CRD)
refuses some; mpi-operator v0.8.2 refuses others after its defaults, with a `ValidationError` Event and no
condition; the rest it takes (condition Created). hvdk8s's verdict with that CRD, its policies left out
(`validate --crd F --no-policy`), must be the cluster's in every case. Where they disagree, the cluster is
right: the test names the case and both verdicts.

Not here: `runPolicy.managedBy` naming another controller. The operator skips such a job before it validates
it (no Event, no condition: nothing to wait for), so the cluster's verdict is silence; hvdk8s refuses an
unknown manager as validation.go's rule says (docs/k8s-stack.md, section 5, difference 13)."""
from __future__ import annotations

import copy
import functools
import time
from pathlib import Path

import pytest
import yaml

from cluster_helpers import GROUP, PLURAL, VERSION, unique
from hvdk8s.mpijob.validate import load_crd_schema, validate_mpijob

GOLDEN = Path(__file__).resolve().parent / "golden" / "cpu" / "mpijob.yaml"


def _set(path: str, value):
    def change(job: dict) -> None:
        *parents, last = path.split(".")
        node = job
        for key in parents:
            node = node.setdefault(key, {})
        if value is _DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return change


_DELETE = object()
WORKER, LAUNCHER = "spec.mpiReplicaSpecs.Worker", "spec.mpiReplicaSpecs.Launcher"
CASES = {
    "as rendered": lambda job: None,
    "cleanPodPolicy Sometimes": _set("spec.runPolicy.cleanPodPolicy", "Sometimes"),
    "cleanPodPolicy left out": _set("spec.runPolicy.cleanPodPolicy", _DELETE),
    "managedBy the operator": _set("spec.runPolicy.managedBy", "kubeflow.org/mpi-operator"),
    "negative backoffLimit": _set("spec.runPolicy.backoffLimit", -1),
    "negative ttlSecondsAfterFinished": _set("spec.runPolicy.ttlSecondsAfterFinished", -5),
    "negative activeDeadlineSeconds": _set("spec.runPolicy.activeDeadlineSeconds", -1),
    "negative slotsPerWorker": _set("spec.slotsPerWorker", -1),
    "slotsPerWorker left out": _set("spec.slotsPerWorker", _DELETE),
    "empty sshAuthMountPath": _set("spec.sshAuthMountPath", ""),
    "mpiImplementation MPICH": _set("spec.mpiImplementation", "MPICH"),
    "mpiImplementation Other": _set("spec.mpiImplementation", "Other"),
    "two launchers": _set(f"{LAUNCHER}.replicas", 2),
    "launcher replicas left out": _set(f"{LAUNCHER}.replicas", _DELETE),
    "no launcher": _set(LAUNCHER, _DELETE),
    "no worker": _set(WORKER, _DELETE),
    "zero workers": _set(f"{WORKER}.replicas", 0),
    "worker replicas left out": _set(f"{WORKER}.replicas", _DELETE),
    "worker restartPolicy Always": _set(f"{WORKER}.restartPolicy", "Always"),
    "launcher restartPolicy left out": _set(f"{LAUNCHER}.restartPolicy", _DELETE),
    "worker without containers": _set(f"{WORKER}.template.spec.containers", []),
    "name starting with a digit": _set("metadata.name", "7-{name}"),
    "name too long for the workers' hostnames": _set("metadata.name", "{name}-" + "x" * 50),
}


@functools.lru_cache(maxsize=None)
def _crd_schema(path: Path) -> dict:
    return load_crd_schema(path)


def _cluster_verdict(cluster, namespace: str, job: dict) -> str:
    """'refused by the API server: ...', 'refused by the operator: ...' or 'taken'."""
    from kubernetes import client

    name = job["metadata"]["name"]
    created = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(job), check=False)
    if created.returncode != 0:
        return f"refused by the API server: {created.stderr.strip()}"
    api = cluster.api()
    deadline = time.monotonic() + 60  # a watchdog: the operator answers within a second or two
    try:
        while True:
            events = client.CoreV1Api(api).list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name},reason=ValidationError").items
            if events:
                return f"refused by the operator: {events[0].message}"
            status = client.CustomObjectsApi(api).get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
            if any(c["type"] == "Created" for c in status.get("conditions") or []):
                return "taken"
            assert time.monotonic() < deadline, f"the operator said nothing of {namespace}/{name} within 60s"
            time.sleep(0.2)
    finally:
        cluster.kubectl("delete", "mpijob", "-n", namespace, name, "--wait=false", check=False)


@pytest.mark.parametrize("case", CASES)
def test_validate_agrees_with_the_api_server_and_the_operator(own_cluster, namespace, case):
    job = copy.deepcopy(yaml.safe_load(GOLDEN.read_text()))
    job["metadata"].update(name=unique("rules"), namespace=namespace)
    CASES[case](job)
    job["metadata"]["name"] = job["metadata"]["name"].format(name=unique("r"))
    problems = validate_mpijob(job, schema=_crd_schema(own_cluster.crd), policies=False)
    verdict = _cluster_verdict(own_cluster, namespace, job)
    ours = "refused: " + "; ".join(map(str, problems)) if problems else "taken"
    assert (verdict == "taken") == (not problems), f"{case}: the cluster: {verdict}; hvdk8s: {ours}"
