"""Prometheus scraping of the pods that run a job's ranks: the metrics port they declare, the annotations
most clusters' scrape configs look for, and the Prometheus Operator's PodMonitor.

The ranks serve their metrics when the job as handed to a cluster has them on (`with_backend_defaults`,
cluster=True: on unless the job file says `enabled: false`); the first rank of each node serves all of
the node's ranks on `observability.metrics.port`, so a pod is one scrape target on one port
(hvdk8s.metrics).
"""
from __future__ import annotations

from typing import Any

from hvdk8s.spec import JobSpec, with_backend_defaults

PORT_NAME = "metrics"  # the container port's name, which the PodMonitor's endpoint names
PATH = "/metrics"
POD_MONITOR_API = "monitoring.coreos.com/v1"
POD_MONITOR_KIND = "PodMonitor"
POD_MONITOR_PLURAL = "podmonitors"


def enabled(spec: JobSpec) -> bool:
    """Whether the ranks serve metrics on a cluster."""
    return bool(with_backend_defaults(spec, cluster=True).observability.metrics.enabled)


def wants_pod_monitor(spec: JobSpec) -> bool:
    return enabled(spec) and spec.observability.metrics.pod_monitor


def container_ports(spec: JobSpec) -> list[dict[str, Any]]:
    """The port a container that runs ranks declares (none with metrics off)."""
    if not enabled(spec):
        return []
    return [{"name": PORT_NAME, "containerPort": spec.observability.metrics.port, "protocol": "TCP"}]


def pod_annotations(spec: JobSpec) -> dict[str, str]:
    """The prometheus.io/* annotations of a pod that runs ranks (the convention of Prometheus's own
    Kubernetes example scrape config, which most clusters' configs follow)."""
    if not enabled(spec):
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.observability.metrics.port),
            "prometheus.io/path": PATH}


def pod_monitor(spec: JobSpec, metadata: dict[str, Any], selector: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor scraping the pods that `selector` (a label selector) picks, in the job's namespace."""
    m = spec.observability.metrics
    return {"apiVersion": POD_MONITOR_API, "kind": POD_MONITOR_KIND, "metadata": metadata,
            "spec": {"selector": selector,
                     "podMetricsEndpoints": [{"port": PORT_NAME, "path": PATH,
                                              "interval": f"{m.scrape_interval_seconds}s"}]}}
