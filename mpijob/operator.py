"""The pods mpi-operator v0.8.2 creates from an MPIJob's templates (newWorker and newLauncherPodTemplate in
pkg/controller/mpi_job_controller.go), as far as admission and Pod Security see them: a Pod Security or
API-server check of a template is only as good as its picture of the real pod.

The operator adds, to every pod: its labels, the hostname and subdomain, the SSH key Secret volume mounted
on the first container at sshAuthMountPath, and the restart policy of the replica spec; to the launcher:
the hostfile ConfigMap at /etc/mpi and OpenMPI's variables; to workers: a DNS search domain and, with no
command given, `/usr/sbin/sshd -De`. (With gang scheduling it also sets schedulerName, which no admission
control here depends on.)
"""
from __future__ import annotations

import copy
from typing import Any

from hvdk8s.core import layout

from .api import LAUNCHER, WORKER

SSH_AUTH_MOUNT_DEFAULT = "/root/.ssh"  # SetDefaults_MPIJob's sshAuthMountPath
OPERATOR_LABELS = ("training.kubeflow.org/operator-name", "training.kubeflow.org/job-name",
                   "training.kubeflow.org/job-role")


def _defaulted_spec(job: dict) -> dict:
    spec = copy.deepcopy(job.get("spec") or {})
    spec.setdefault("sshAuthMountPath", SSH_AUTH_MOUNT_DEFAULT)
    spec.setdefault("slotsPerWorker", 1)
    return spec


def pods(job: dict) -> dict[str, list[dict[str, Any]]]:
    """{"Launcher": [pod], "Worker": [pod, ...]}: the Pods (metadata + spec) the operator creates."""
    spec = _defaulted_spec(job)
    name = job["metadata"]["name"]
    namespace = job["metadata"].get("namespace", "default")
    replicas = spec.get("mpiReplicaSpecs") or {}
    out: dict[str, list[dict[str, Any]]] = {}
    if LAUNCHER in replicas:
        out[LAUNCHER] = [_pod(spec, replicas[LAUNCHER], f"{name}-launcher", name, namespace, "launcher")]
    worker = replicas.get(WORKER)
    if worker is not None:
        out[WORKER] = [_pod(spec, worker, f"{name}-worker-{i}", name, namespace, "worker")
                       for i in range(int(worker.get("replicas") or 0))]
    return out


def added_volumes(spec: dict, replica_type: str) -> dict[str, str]:
    """{volume name: mount path on the first container} of the volumes the operator adds to the pods of
    REPLICA_TYPE (Launcher or Worker) under SPEC, an MPIJob's spec as written (its "" path is defaulted too)."""
    added = {layout.OPERATOR_SSH_VOLUME: spec.get("sshAuthMountPath") or SSH_AUTH_MOUNT_DEFAULT}
    if replica_type == LAUNCHER:
        added[layout.OPERATOR_CONFIG_VOLUME] = layout.OPERATOR_CONFIG_DIR
    return added


def _pod(spec: dict, replica: dict, pod_name: str, job_name: str, namespace: str, role: str) -> dict[str, Any]:
    template = copy.deepcopy(replica.get("template") or {})
    meta = template.setdefault("metadata", {})
    meta["name"], meta["namespace"] = pod_name, namespace
    meta.setdefault("labels", {}).update(dict(zip(OPERATOR_LABELS, ("mpi-operator", job_name, role))))
    pod = template.setdefault("spec", {})
    pod["hostname"], pod["subdomain"] = pod_name, job_name
    pod["restartPolicy"] = replica.get("restartPolicy") or ("OnFailure" if role == "launcher" else "Never")
    first = pod["containers"][0]
    secret: dict[str, Any] = {"secretName": f"{job_name}-ssh"}
    if spec["sshAuthMountPath"] == SSH_AUTH_MOUNT_DEFAULT:
        secret["defaultMode"] = 0o600
    pod.setdefault("volumes", []).append({"name": layout.OPERATOR_SSH_VOLUME, "secret": secret})
    first.setdefault("volumeMounts", []).append({"name": layout.OPERATOR_SSH_VOLUME,
                                                 "mountPath": spec["sshAuthMountPath"]})
    first.setdefault("env", []).append({"name": "K_MPI_JOB_ROLE", "value": role})
    if role == "worker":
        domain = f"{job_name}.{namespace}.svc.cluster.local"
        pod.setdefault("dnsConfig", {}).setdefault("searches", []).append(domain)
        if not first.get("command") and not first.get("args"):
            first["command"] = ["/usr/sbin/sshd", "-De"]
    else:
        pod["volumes"].append({"name": layout.OPERATOR_CONFIG_VOLUME,
                               "configMap": {"name": f"{job_name}-config"}})
        first["volumeMounts"].append({"name": layout.OPERATOR_CONFIG_VOLUME, "mountPath": layout.OPERATOR_CONFIG_DIR})
        first["env"] += [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
                         {"name": "OMPI_MCA_orte_default_hostfile", "value": layout.HOSTFILE},
                         {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
                         {"name": "OMPI_MCA_orte_set_default_slots", "value": str(spec["slotsPerWorker"])}]
    return template
