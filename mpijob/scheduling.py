"""Where and when a job's pods are scheduled: node selectors and tolerations (workers and launcher),
the workers' spread over nodes, priority and scheduler, and gang scheduling through the MPI operator's
`runPolicy.schedulingPolicy`."""
from __future__ import annotations

from typing import Any, Optional

from hvdk8s.spec import JobSpec

from .topology import Topology

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def toleration(t) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (("key", t.key), ("operator", t.operator), ("value", t.value), ("effect", t.effect),
                       ("tolerationSeconds", t.toleration_seconds)):
        if value is not None:
            out[key] = value
    return out


def _placement(selector: dict[str, str], tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    placement: dict[str, Any] = {}
    if selector:
        placement["nodeSelector"] = dict(sorted(selector.items()))
    if tolerations:
        placement["tolerations"] = tolerations
    return placement


def worker_placement(spec: JobSpec, topo: Topology) -> dict[str, Any]:
    """nodeSelector and tolerations of the nodes a job's workers (and its cache warm-up) use."""
    selector = dict(spec.kubernetes.node_selector)
    if spec.resources.gpu_product:
        selector["nvidia.com/gpu.product"] = spec.resources.gpu_product
    tolerations = [dict(GPU_TOLERATION)] if topo.gpus_per_worker else []
    tolerations += [toleration(t) for t in spec.kubernetes.tolerations]
    return _placement(selector, tolerations)


def launcher_placement(spec: JobSpec) -> dict[str, Any]:
    """The launcher needs no GPU: it goes where kubernetes.launcher says (anywhere by default)."""
    launcher = spec.kubernetes.launcher
    return _placement(dict(launcher.node_selector), [toleration(t) for t in launcher.tolerations])


def priority_and_scheduler(spec: JobSpec) -> dict[str, Any]:
    k8s = spec.kubernetes
    out: dict[str, Any] = {}
    if k8s.priority_class:
        out["priorityClassName"] = k8s.priority_class
    if k8s.scheduler_name:
        out["schedulerName"] = k8s.scheduler_name
    return out


def spread_workers(worker_labels: dict[str, str], topo: Topology) -> dict[str, Any]:
    """GPU jobs: at most one worker per node (required). CPU jobs: spread where possible."""
    term = {"labelSelector": {"matchLabels": worker_labels}, "topologyKey": "kubernetes.io/hostname"}
    if topo.one_worker_per_node:
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term}]}}


def gang(spec: JobSpec, topo: Topology) -> Optional[dict[str, Any]]:
    """runPolicy.schedulingPolicy for gang scheduling, or None. minAvailable counts every pod (the launcher
    too): Horovod without elastic mode needs all of its ranks, so a partial gang would only hold GPUs idle."""
    policy = spec.kubernetes.scheduling_policy
    if policy is None:
        return None
    pods = 1 + (0 if spec.kubernetes.run_launcher_as_worker else topo.workers)
    out: dict[str, Any] = {"minAvailable": pods}
    for key, value in (("queue", policy.queue), ("priorityClass", policy.priority_class),
                       ("scheduleTimeoutSeconds", policy.schedule_timeout_seconds)):
        if value is not None:
            out[key] = value
    return out


def launcher_creation_policy(spec: JobSpec) -> str:
    """WaitForWorkersReady: the operator creates the launcher once every worker is Ready. Not with a gang:
    the gang counts the launcher, which that policy withholds until the gang is placed, so neither would
    ever start; the launcher is then created at once and waits for the workers itself (hvdk8s.launch.workers)."""
    return "AtStartup" if spec.kubernetes.scheduling_policy is not None else "WaitForWorkersReady"
