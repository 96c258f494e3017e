"""The node-local dataset cache on a cluster: the hostPath volume the pods of a job with a cached dataset
mount, the init containers that fill it before training, and a DaemonSet that pre-warms the nodes' caches.

A dataset is synced once per node and namespace and reused by later jobs of that namespace (`hvdk8s
cache sync` skips what is already there and verified). Each namespace has its own directory on the node,
`<cache_dir>/<namespace>`, and a pod mounts only that one (at cache_dir), so a job cannot see, let alone
overwrite, another namespace's datasets. Jobs without a cached dataset get no hostPath at all.
"""
from __future__ import annotations

import posixpath
from typing import Any

from hvdk8s.core import layout
from hvdk8s.spec import S3_SECRET_KEYS, S3_SECRET_OPTIONAL_KEYS, JobSpec

from . import security, volumes

VOLUME = layout.CACHE_VOLUME


def node_dir(spec: JobSpec) -> str:
    """The directory on the node that holds this job's namespace's datasets."""
    return posixpath.join(spec.kubernetes.cache_dir, spec.kubernetes.namespace)


def cache_volume(spec: JobSpec) -> dict[str, Any]:
    return {"name": VOLUME, "hostPath": {"path": node_dir(spec), "type": "DirectoryOrCreate"}}


def cache_mount(spec: JobSpec) -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": spec.kubernetes.cache_dir}


def source_volume(spec: JobSpec):
    """The job volume a local dataset path is synced from (None for s3:// and http(s):// sources)."""
    d = spec.cached_dataset
    return None if d is None or d.remote else volumes.covering(spec, d.path)


# How long the ranks may take, beyond the launcher's wait for the workers, to hold the dataset themselves.
LEASE_MARGIN_SECONDS = 600


def lease_seconds(spec: JobSpec) -> int:
    """How long the init container's sync leases the dataset. The init container exits once synced, and
    the ranks take their own hold only when mpirun starts them: after the launcher has waited (up to
    worker_wait_seconds) for every worker, then within seconds. In between nothing holds the dataset,
    and another job's `cache sync --quota` or a `cache evict` on the node would remove it; the lease
    keeps it through that wait plus a generous margin, and then expires by itself, so a job that never
    starts its ranks does not pin the dataset."""
    return spec.kubernetes.worker_wait_seconds + LEASE_MARGIN_SECONDS


def sync_command(spec: JobSpec) -> list[str]:
    cmd = ["hvdk8s", "cache", "sync", spec.dataset.path, spec.kubernetes.cache_dir]
    if spec.dataset.version:
        cmd += ["--dataset-version", spec.dataset.version]
    if spec.kubernetes.cache_quota:
        cmd += ["--quota", spec.kubernetes.cache_quota]
    return cmd + ["--lease", f"{lease_seconds(spec)}s"]


# A proxy the job sets for its ranks (kubernetes.env or secret_env) is one the sync must go through too.
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
# Under the job ConfigMap's folder, which no user volume may overlap; the sync container does not mount the ConfigMap.
CA_VOLUME, CA_DIR = layout.S3_CA_VOLUME, f"{layout.JOB_DIR}/s3-ca"


def _source_env(spec: JobSpec) -> list[dict[str, Any]]:
    """What a sync from the source needs: an S3 source's endpoint, region, CA bundle and credentials (the
    secret is referenced, its values never rendered), and the job's proxy variables."""
    k8s, s3 = spec.kubernetes, spec.dataset.s3
    env: list[dict[str, Any]] = []
    if spec.dataset.path.startswith("s3://"):
        if s3.endpoint_url:
            env.append({"name": "AWS_ENDPOINT_URL", "value": s3.endpoint_url})
        if s3.region:  # botocore reads AWS_DEFAULT_REGION, newer SDKs AWS_REGION
            env += [{"name": name, "value": s3.region} for name in ("AWS_DEFAULT_REGION", "AWS_REGION")]
        if s3.ca_bundle:
            env.append({"name": "AWS_CA_BUNDLE", "value": f"{CA_DIR}/{s3.ca_bundle.key}"})
        if s3.credentials_secret:
            env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": s3.credentials_secret, "key": key}}}
                    for key in S3_SECRET_KEYS]
            env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": s3.credentials_secret, "key": key,
                                                                 "optional": True}}}
                    for key in S3_SECRET_OPTIONAL_KEYS]
    for name in PROXY_ENV:
        if name in k8s.env:
            env.append({"name": name, "value": k8s.env[name]})
        elif name in k8s.secret_env:
            ref = k8s.secret_env[name]
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}})
    return env


def _ca_volume(spec: JobSpec) -> list[dict[str, Any]]:
    """The volume of an S3 source's CA bundle (a Secret or a ConfigMap), if it has one."""
    ca = spec.dataset.s3.ca_bundle if spec.dataset.path.startswith("s3://") else None
    if ca is None:
        return []
    source = {"secret": {"secretName": ca.secret}} if ca.secret else {"configMap": {"name": ca.config_map}}
    return [{"name": CA_VOLUME, **source}]


def init_containers(spec: JobSpec, resources: dict[str, Any]) -> list[dict[str, Any]]:
    """Containers that run before a worker (or warm pod) starts: none unless the dataset is cached.

    The kubelet creates a missing hostPath directory owned by root; the first container hands it to the
    non-root MPI user with CAP_CHOWN alone (root, but not privileged: such jobs need the privileged Pod
    Security level for their hostPath anyway), the second syncs the dataset as that user."""
    if spec.cached_dataset is None:
        return []
    k8s = spec.kubernetes
    image = {"image": spec.image, "imagePullPolicy": k8s.image_pull_policy}
    source_env = _source_env(spec)
    source = source_volume(spec)
    sync_mounts = [cache_mount(spec)] + ([volumes.mount(source, read_only=True)] if source is not None else [])
    sync_mounts += [{"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True} for _ in _ca_volume(spec)]
    return [
        {"name": "cache-permissions", **image,
         "command": ["chown", f"{k8s.run_as_user}:{k8s.run_as_user}", k8s.cache_dir],
         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
         "securityContext": security.root_with("CHOWN"),
         "volumeMounts": [cache_mount(spec)]},
        {"name": VOLUME, **image, "command": sync_command(spec),
         **({"env": source_env} if source_env else {}),
         "resources": resources,
         "securityContext": security.container(),
         "volumeMounts": sync_mounts},
    ]


def pod_volumes(spec: JobSpec, with_source: bool) -> list[dict[str, Any]]:
    """The cache volume of a job with a cached dataset, and (WITH_SOURCE, for pods that do not mount the
    job's volumes anyway) the volume a local dataset is synced from."""
    if spec.cached_dataset is None:
        return []
    source = source_volume(spec) if with_source else None
    return [cache_volume(spec)] + ([volumes.pod_volume(source)] if source is not None else []) + _ca_volume(spec)


def warm_daemonset(spec: JobSpec, pod_placement: dict[str, Any]) -> dict[str, Any]:
    """A DaemonSet whose pods fill the cache on every node the job's workers may use, then idle.
    `kubectl rollout status daemonset/<name>` returns once every node is warm; delete it after."""
    if spec.cached_dataset is None:
        raise ValueError("dataset: nothing to warm: only `path` datasets that are cached (s3://, http(s)://, "
                         "or `cache: true`) use the node-local cache")
    name = f"{spec.name}-cache-warm"
    labels = {"hvdk8s.io/job": spec.name, "hvdk8s.io/role": "cache-warm"}
    requests = {"cpu": "1", "memory": "1Gi"}
    idle = {"name": "warm", "image": spec.image, "imagePullPolicy": spec.kubernetes.image_pull_policy,
            "command": ["sleep", "infinity"],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}},
            "securityContext": security.container()}
    pod = {"securityContext": security.pod(spec.kubernetes),
           "initContainers": init_containers(spec, {"requests": requests, "limits": requests}),
           "containers": [idle], "volumes": pod_volumes(spec, with_source=True), **pod_placement}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": spec.kubernetes.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "hvdk8s", **labels}},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}
