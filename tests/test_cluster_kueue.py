"""Jobs with `kubernetes.queue` through real Kueue (v0.17, its MPIJob integration) and the real mpi-operator
on the project's cluster, whose kwok nodes have NODE_GPUS `nvidia.com/gpu` each: a queued job is created
suspended; Kueue admits it when its ClusterQueue has the GPUs it asks for, and only then does the operator
make its pods (a launcher Job, if any, suspended and without a pod before admission); the scheduler puts one 8-GPU worker on each node
(slotsPerWorker 8); a job the quota cannot hold stays suspended with nothing made, and is admitted once
the first job's GPUs are free again.
"""
from __future__ import annotations

import time

import pytest
import yaml

from cluster_helpers import GROUP, NODE_GPUS, NODES, PLURAL, VERSION, end_launcher, job_pods, unique, wait_phase
from conftest import ROOT

GPU_JOB = ROOT / "tests" / "golden" / "gpu-4x8-tcp" / "job.yaml"
GPUS = NODES * NODE_GPUS  # one job takes every GPU of the cluster


@pytest.fixture
def queue(own_cluster, namespace):
    """A ClusterQueue with quota for GPUS GPUs and a LocalQueue for it in the test's namespace; its name."""
    cq, lq = unique("cq"), unique("lq")
    own_cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
             "flavors": [{"name": "default", "resources": [
                 {"name": "cpu", "nominalQuota": "512"}, {"name": "memory", "nominalQuota": "4Ti"},
                 {"name": "nvidia.com/gpu", "nominalQuota": str(GPUS)}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": lq, "namespace": namespace},
         "spec": {"clusterQueue": cq}}]))
    yield lq
    own_cluster.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)


def _gpu_job(tmp_path, namespace: str, queue: str, name: str):
    data = yaml.safe_load(GPU_JOB.read_text())
    data["name"] = name
    data["resources"].update({"cpu": "16", "memory": "64Gi", "shm_size": "8Gi"})  # fits a kwok node (32 CPUs)
    data["kubernetes"] = {"namespace": namespace, "queue": queue}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _mpijob(cluster, namespace: str, name: str) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def _workload(cluster, namespace: str, name: str, timeout: float = 120) -> dict:
    """Kueue's Workload for the MPIJob `name` (it makes one per job), once there."""
    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api())
    deadline = time.monotonic() + timeout  # a watchdog
    while True:
        for w in custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]:
            if any(o["kind"] == "MPIJob" and o["name"] == name for o in w["metadata"].get("ownerReferences", [])):
                return w
        assert time.monotonic() < deadline, f"no Workload for {namespace}/{name} within {timeout}s"
        time.sleep(0.2)


def _condition(obj: dict, kind: str) -> dict:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _launcher_job(cluster, namespace: str, name: str):
    """The operator's launcher Job of the MPIJob `name`, None while there is none."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.BatchV1Api(cluster.api()).read_namespaced_job(f"{name}-launcher", namespace)
    except ApiException as e:
        assert e.status == 404
        return None


def test_kueue_admits_by_gpu_quota_and_the_operator_waits_for_admission(own_cluster, namespace, queue, tmp_path):
    first, second = unique("gpu-a"), unique("gpu-b")
    run = own_cluster.cli("launch", _gpu_job(tmp_path, namespace, queue, first))
    assert run.returncode == 0, run.stderr
    # (created suspended: Kueue unsuspends it at once, as there is quota; the held job below stays so)

    # Admitted: Kueue reserved the quota for all 32 GPUs and unsuspended the job; one worker per node.
    wait_phase(own_cluster, namespace, first, "Running")
    workload = _workload(own_cluster, namespace, first)
    assert _condition(workload, "Admitted").get("status") == "True", workload.get("status")
    usage = {r["name"]: r["total"] for a in workload["status"]["admission"]["podSetAssignments"]
             for r in [{"name": k, "total": v} for k, v in a.get("resourceUsage", {}).items()]}
    assert usage.get("nvidia.com/gpu") in (str(GPUS), GPUS), workload["status"]["admission"]
    workers = job_pods(own_cluster, namespace, first, "worker")
    assert len(workers) == NODES and len({p.spec.node_name for p in workers}) == NODES  # 8 GPUs, one node each
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] == str(NODE_GPUS) for p in workers)

    # Held: no GPUs left; the second job stays suspended, and neither Kueue nor the operator makes anything.
    assert own_cluster.cli("launch", _gpu_job(tmp_path, namespace, queue, second)).returncode == 0
    held = _workload(own_cluster, namespace, second)
    deadline = time.monotonic() + 120  # a watchdog: Kueue tries to admit it, and says why it cannot
    while "insufficient" not in _condition(held, "QuotaReserved").get("message", "").lower():
        assert time.monotonic() < deadline, held.get("status")
        time.sleep(0.2)
        held = _workload(own_cluster, namespace, second)
    assert _condition(held, "QuotaReserved")["status"] == "False"
    assert _mpijob(own_cluster, namespace, second)["spec"]["runPolicy"]["suspend"] is True
    assert job_pods(own_cluster, namespace, second, "worker") == []
    # mpi-operator v0.8 makes the launcher Job of a suspended MPIJob at once, suspended too: no launcher pod.
    launcher = _launcher_job(own_cluster, namespace, second)
    assert launcher is None or launcher.spec.suspend is True
    assert job_pods(own_cluster, namespace, second, "launcher") == []
    wait_phase(own_cluster, namespace, second, "Suspended")  # what `hvdk8s status` calls it

    # The first job ends: its quota is released and the second is admitted and runs.
    end_launcher(own_cluster, namespace, first, 0)
    wait_phase(own_cluster, namespace, first, "Succeeded")
    wait_phase(own_cluster, namespace, second, "Running")
    assert _condition(_workload(own_cluster, namespace, second), "Admitted").get("status") == "True"
    assert len(job_pods(own_cluster, namespace, second, "worker")) == NODES
