"""Every cluster failure `hvdk8s launch` and the cluster verbs name, produced for real: a stopped API
server, no MPIJob CRD, the training-operator's MPIJob v1 in its place, a CRD that refuses a field, a
user without rights, a half-made launch rolled back, a PodMonitor asked of a cluster without them. Each
is one line of cause and remedy, exit 2, and nothing left behind. (A missing namespace and a wait that
times out: test_cluster_launch.py.)

Most of these change the project's own API server (stop it, swap its CRD, log in as its rights-less
`nobody`), so they skip on another cluster. The CRD is put back after each test that swaps it.
"""
from __future__ import annotations

import copy
import json

import pytest
import yaml
from kubernetes import client

from cluster_helpers import GROUP, NOBODY, PLURAL, unique, wait_phase


def _one_line(run) -> str:
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    return lines[0]


def _mpijobs(cluster) -> set[tuple[str, str]]:
    listed = cluster.kubectl("get", f"{PLURAL}.{GROUP}", "-A", "-o", "json", check=False)
    if listed.returncode != 0:
        return set()
    return {(j["metadata"]["namespace"], j["metadata"]["name"]) for j in json.loads(listed.stdout)["items"]}


def _configmaps(cluster, namespace) -> set[str]:
    listed = json.loads(cluster.kubectl("get", "configmaps", "-n", namespace, "-o", "json").stdout)
    return {c["metadata"]["name"] for c in listed["items"]}


@pytest.fixture
def swapped_crd(own_cluster):
    """Take the MPIJob CRD away for one test (`install` puts another in its place); restored after."""
    own_cluster.delete_crd()
    yield own_cluster
    own_cluster.delete_crd()
    own_cluster.install_crd(own_cluster.crd.read_text())


@pytest.fixture
def job(job_file, namespace):
    name = unique("fail")
    return job_file({"name": name, "kubernetes": {"namespace": namespace}}), name


def test_a_stopped_api_server_is_named_with_its_address(own_cluster, job, namespace):
    path, name = job
    server = yaml.safe_load(own_cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    own_cluster.stop_apiserver()
    try:
        for run in (own_cluster.cli("launch", path), own_cluster.cli("status", name, "-n", namespace),
                    own_cluster.cli("list")):
            line = _one_line(run)
            assert f"cannot reach the Kubernetes API server at {server} (context hvdk8s-test): connection " \
                   "refused; check that the cluster is up" in line
    finally:
        own_cluster.start_apiserver()
    assert (namespace, name) not in _mpijobs(own_cluster)
    # The cluster works again, the operator included (it lost its leader lease with the API server).
    assert own_cluster.cli("launch", path).returncode == 0
    wait_phase(own_cluster, namespace, name, "Running")
    # The nodes keep their addresses, so pods/log reaches them: kwok re-initialises a node whose lease lapsed
    # while the server was down, which emptied them (start-135.sh gives each node both addresses).
    nodes = client.CoreV1Api(own_cluster.api()).list_node(label_selector="type=kwok").items
    addresses = {n.metadata.name: sorted(a.type for a in n.status.addresses or []) for n in nodes}
    assert set(map(tuple, addresses.values())) == {("Hostname", "InternalIP")}, addresses
    logs = own_cluster.cli("logs", name, "-n", namespace)
    assert logs.returncode == 0, logs.stderr


def test_no_mpijob_crd_says_how_to_install_mpi_operator(swapped_crd, job, namespace):
    path, name = job
    for run in (swapped_crd.cli("launch", path), swapped_crd.cli("status", name, "-n", namespace)):
        line = _one_line(run)
        assert "serves no MPIJobs (no mpijobs.kubeflow.org CRD); install mpi-operator (kubectl apply " \
               "--server-side -f https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/" \
               "mpi-operator.yaml)" in line  # the release whose CRD the cluster installs
    assert _configmaps(swapped_crd, namespace) <= {"kube-root-ca.crt"}


def test_the_training_operators_mpijob_v1_is_refused(swapped_crd, job, namespace):
    """The Kubeflow training-operator serves MPIJob as kubeflow.org/v1 under the same CRD name."""
    swapped_crd.install_crd(yaml.safe_dump({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"kind": "MPIJob", "listKind": "MPIJobList", "plural": PLURAL, "singular": "mpijob"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}}))
    path, name = job
    line = _one_line(swapped_crd.cli("launch", path))
    assert "the cluster serves MPIJob as kubeflow.org/v1 (the Kubeflow training-operator's API), not " \
           "kubeflow.org/v2beta1" in line and "install mpi-operator" in line
    assert not [j for j in _mpijobs(swapped_crd) if j[0] == namespace]


def test_a_crd_that_refuses_a_field_refuses_the_launch(swapped_crd, job, namespace):
    """An older mpi-operator's CRD, without launcherCreationPolicy: checked against the served schema
    before anything is sent (an API server before 1.25, without field validation, would silently drop it)."""
    crd = yaml.safe_load(swapped_crd.crd.read_text())
    older = copy.deepcopy(crd)
    spec_schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec_schema["properties"]["launcherCreationPolicy"]
    swapped_crd.install_crd(yaml.safe_dump(older))
    path, name = job
    run = swapped_crd.cli("launch", path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "the MPIJob does not pass the MPIJob CRD this cluster serves; nothing was created" in run.stderr
    assert "spec.launcherCreationPolicy" in run.stderr
    assert (namespace, name) not in _mpijobs(swapped_crd)


def test_a_user_without_rights_is_told_it_is_forbidden(own_cluster, job, namespace):
    path, name = job
    run = own_cluster.cli("launch", path, "--context", NOBODY)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "note: may not read the mpijobs.kubeflow.org CRD here: checked against hvdk8s's own MPIJob rules" \
        in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f'forbidden: mpijobs.kubeflow.org "{name}" is forbidden: User "nobody" cannot ' \
                                f'get resource "mpijobs"' in errors[0]
    assert f"ask a cluster admin for a Role that allows it in namespace {namespace}" in errors[0]
    for verb in (("status", name), ("list",), ("delete", name), ("wait", name, "--timeout", "5s")):
        line = _one_line(own_cluster.cli(*verb, "-n", namespace, "--context", NOBODY))
        assert 'User "nobody" cannot' in line
    assert (namespace, name) not in _mpijobs(own_cluster)


def test_a_configmap_that_cannot_be_made_takes_the_mpijob_back(own_cluster, job, namespace):
    """`nobody` may make MPIJobs here but not ConfigMaps: the MPIJob is created, the ConfigMap refused,
    and the MPIJob deleted again, so that no half of a job is left."""
    own_cluster.kubectl("create", "role", "mpijobs-only", "-n", namespace, "--verb=get,list,create,delete",
                        f"--resource={PLURAL}.{GROUP}")
    own_cluster.kubectl("create", "role", "read-configmaps", "-n", namespace, "--verb=get", "--resource=configmaps")
    for role in ("mpijobs-only", "read-configmaps"):
        own_cluster.kubectl("create", "rolebinding", role, "-n", namespace, f"--role={role}", "--user=nobody")
    path, name = job
    run = own_cluster.cli("launch", path, "--context", NOBODY)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert f"creating configmap {name}-job failed: forbidden: " in errors[0]
    assert f"mpijob {name} was deleted again, nothing is left" in errors[0]
    assert (namespace, name) not in _mpijobs(own_cluster)
    assert f"{name}-job" not in _configmaps(own_cluster, namespace)


def test_credentials_the_server_rejects_are_named(cluster, tmp_path):
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    config["users"] = [{"name": current["context"]["user"], "user": {"token": "not-a-valid-token"}}]
    stale = tmp_path / "stale-kubeconfig"
    stale.write_text(yaml.safe_dump(config))
    line = _one_line(cluster.cli("list", "--kubeconfig", stale))
    assert f"rejected the credentials of context {current['name']} (401 Unauthorized); log in again" in line


def test_no_kubeconfig_or_an_unknown_context_say_what_to_set(cluster, job, tmp_path):
    path, _ = job
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    run = subprocess.run([sys.executable, "-m", "hvdk8s", "launch", str(path)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert "no kubeconfig at " in _one_line(run) and "set KUBECONFIG" in run.stderr
    line = _one_line(cluster.cli("status", "x", "--context", "nosuch"))
    assert "no context 'nosuch' in " in line and "pick one of: " in line
    line = _one_line(cluster.cli("status", "x", "--context", "hvdk8s-tset"))  # a typo: the one meant
    assert "no context 'hvdk8s-tset' in " in line and "did you mean hvdk8s-test?" in line, line


# --- the PodMonitor (observability.metrics.pod_monitor): the Prometheus Operator's CRD, or none ----------

# A stand-in for the Prometheus Operator's CRD: its names, and no schema beyond "an object".
POD_MONITOR_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podmonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PodMonitor, listKind: PodMonitorList, plural: podmonitors, singular: podmonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@pytest.fixture
def pod_monitor_crd(own_cluster):
    """The PodMonitor CRD, for one test; removed after (the other tests' cluster has none)."""
    own_cluster.install_crd(POD_MONITOR_CRD)
    yield own_cluster
    own_cluster.delete_crd("podmonitors.monitoring.coreos.com")


@pytest.fixture
def monitored(job_file, namespace):
    name = unique("pm")
    return job_file({"name": name, "kubernetes": {"namespace": namespace},
                     "observability": {"metrics": {"pod_monitor": True}}}), name


def _pod_monitor(cluster, namespace, name):
    got = cluster.kubectl("get", "podmonitors.monitoring.coreos.com", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 else None


def test_a_pod_monitor_without_its_crd_is_refused_before_anything_is_made(own_cluster, monitored, namespace):
    path, name = monitored
    line = _one_line(own_cluster.cli("launch", path))
    assert "serves no PodMonitors (no podmonitors.monitoring.coreos.com CRD, monitoring.coreos.com/v1)" in line
    assert line.endswith("install the Prometheus Operator, or set observability.metrics.pod_monitor: false")
    assert (namespace, name) not in _mpijobs(own_cluster)
    assert _configmaps(own_cluster, namespace) <= {"kube-root-ca.crt"}


def test_a_pod_monitor_is_made_owned_by_the_mpijob_and_deleted_with_it(pod_monitor_crd, monitored, namespace):
    path, name = monitored
    run = pod_monitor_crd.cli("launch", path, "-o", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["created"] == [f"mpijob/{name}", f"configmap/{name}-job", f"podmonitor/{name}"]
    job = json.loads(pod_monitor_crd.kubectl("get", f"{PLURAL}.{GROUP}", name, "-n", namespace, "-o", "json").stdout)
    monitor = _pod_monitor(pod_monitor_crd, namespace, name)
    assert monitor["metadata"]["ownerReferences"] == [{
        "apiVersion": f"{GROUP}/v2beta1", "kind": "MPIJob", "name": name, "uid": job["metadata"]["uid"],
        "controller": True}]
    assert monitor["spec"]["selector"] == {"matchLabels": {"hvdk8s.io/job": name, "hvdk8s.io/role": "worker"}}
    deleted = pod_monitor_crd.cli("delete", name, "-n", namespace)
    assert deleted.returncode == 0 and f"deleted podmonitor/{name}" in deleted.stdout, deleted.stderr
    assert _pod_monitor(pod_monitor_crd, namespace, name) is None


def test_a_pod_monitor_that_cannot_be_made_takes_the_job_back(pod_monitor_crd, monitored, namespace):
    """`nobody` may make MPIJobs and ConfigMaps here but not PodMonitors: both are deleted again."""
    own = pod_monitor_crd
    own.kubectl("create", "role", "job-parts", "-n", namespace, "--verb=get,list,create,delete",
                f"--resource={PLURAL}.{GROUP}", "--resource=configmaps")
    own.kubectl("create", "rolebinding", "job-parts", "-n", namespace, "--role=job-parts", "--user=nobody")
    path, name = monitored
    run = own.cli("launch", path, "--context", NOBODY)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"creating podmonitor {name} failed: forbidden: " in errors[0]
    assert f"mpijob {name} and configmap {name}-job were deleted again, nothing is left" in errors[0]
    assert (namespace, name) not in _mpijobs(own)
    assert f"{name}-job" not in _configmaps(own, namespace)
