"""`kubernetes`: where and how the job runs on a cluster (namespace, volumes, tolerations, scheduling,
environment), checked against the rules the API server and the MPI operator apply when they admit the
job, so that a mistake is reported with its field path before anything reaches the cluster."""
from __future__ import annotations

import posixpath
import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from hvdk8s.core import k8snames, layout
from hvdk8s.core.quantity import ByteQuantity
from hvdk8s.core.strict import StrictModel
from hvdk8s.spec.values import INT32_MAX, DataKey, ObjectName, k8s_valid

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretRef(StrictModel):
    secret: ObjectName
    key: DataKey


def _absolute_path(v: str) -> str:
    if not v.startswith("/") or "//" in v or "\0" in v or posixpath.normpath(v) != v:
        raise ValueError(f"{v!r} must be an absolute, normalized path (no '..', '.', '//' or trailing '/')")
    return v


class NFSVolumeSpec(StrictModel):
    server: str = Field(description="the NFS server's host name or IP address")
    path: str = Field(description="the exported directory on the server")

    @field_validator("server")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v or any(c.isspace() or c == "/" for c in v):
            raise ValueError(f"{v!r} is not a host name or IP address")
        return v

    _path = field_validator("path")(_absolute_path)


class VolumeSpec(StrictModel):
    """Storage mounted into the pods that run ranks: exactly one of `pvc`, `nfs` or `host_path`."""

    name: str = Field(description="the volume's name in the pod (lower-case letters, digits, '-')")
    mount_path: str = Field(description="where the ranks see it (absolute)")
    read_only: bool = False
    pvc: Optional[str] = Field(default=None, description="a PersistentVolumeClaim in the job's namespace "
                                                         "(ReadWriteMany when several workers share it)")
    nfs: Optional[NFSVolumeSpec] = None
    host_path: Optional[str] = Field(default=None, description="an existing directory on every node the job uses")
    launcher: bool = Field(default=False, description="also mount it in the launcher pod: software its mpirun or "
                                                      "(elastic jobs) horovodrun needs from the volume")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        k8s_valid(k8snames.dns1123_label, v)
        if v in layout.RESERVED_VOLUMES:
            raise ValueError(f"{v!r} is taken (hvdk8s and the MPI operator use: {', '.join(layout.RESERVED_VOLUMES)})")
        return v

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, v: str) -> str:
        _absolute_path(v)
        taken = [m for m in layout.RESERVED_MOUNTS if layout.overlaps(v, m)]
        if taken:
            raise ValueError(f"{v} overlaps {taken[0]}, which hvdk8s or the MPI operator mounts")
        hidden = [d for d in layout.IMAGE_DIRS if layout.inside(d, v)]
        if hidden:
            raise ValueError(f"{v} would hide the image's {hidden[0]}; mount below it or elsewhere")
        if any(layout.inside(v, d) for d in layout.SYSTEM_DIRS):
            raise ValueError(f"{v} is in a system directory ({', '.join(layout.SYSTEM_DIRS)})")
        return v

    @field_validator("pvc")
    @classmethod
    def _claim(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else k8s_valid(k8snames.dns1123_subdomain, v)

    @field_validator("host_path")
    @classmethod
    def _host_path(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and _absolute_path(v) == "/":
            raise ValueError("the node's whole file system cannot be a volume")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "VolumeSpec":
        if sum(x is not None for x in (self.pvc, self.nfs, self.host_path)) != 1:
            raise ValueError("give exactly one of `pvc` (a PersistentVolumeClaim), `nfs` {server, path} or "
                             "`host_path`")
        return self


class TolerationSpec(StrictModel):
    """A Kubernetes toleration: lets pods run on nodes with a matching taint."""

    key: Optional[str] = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Optional[str] = None
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = None
    toleration_seconds: Optional[int] = Field(default=None, ge=0, description="NoExecute only: how long to stay")

    @field_validator("key")
    @classmethod
    def _key(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else k8s_valid(k8snames.qualified_name, v)

    @model_validator(mode="after")
    def _as_the_api_server_requires(self) -> "TolerationSpec":
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without `key` must have operator Exists (it tolerates every taint)")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no `value`")
        if self.operator == "Equal" and self.value is not None:
            k8s_valid(k8snames.label_value, self.value)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds needs effect NoExecute")
        return self


class LauncherSpec(StrictModel):
    """Where the launcher pod (mpirun, no GPU) may run."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[TolerationSpec] = Field(default_factory=list)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict) -> dict:
        return _label_map(v)


class SchedulingPolicySpec(StrictModel):
    """Gang scheduling by the MPI operator's Volcano or scheduler-plugins integration (enabled in the operator
    with --gang-scheduling): every pod of the job is placed at once, or none is."""

    queue: Optional[str] = Field(default=None, description="Volcano queue")
    priority_class: Optional[str] = Field(default=None, description="the PodGroup's PriorityClass (Volcano)")
    schedule_timeout_seconds: Optional[int] = Field(default=None, ge=1, le=INT32_MAX,
                                                    description="how long to wait for the gang (scheduler-plugins)")

    @field_validator("priority_class", "queue")
    @classmethod
    def _object_name(cls, v: Optional[str]) -> Optional[str]:
        # A PriorityClass's name and a Volcano Queue's (metadata.name of a cluster-scoped object).
        return v if v is None else k8s_valid(k8snames.dns1123_subdomain, v)


def _label_map(v: dict) -> dict:
    problems = k8snames.labels(v)
    if problems:
        raise ValueError("; ".join(p for _, p in problems))
    return v


PodSecurityLevel = Literal["restricted", "baseline", "privileged"]


class KubernetesSpec(StrictModel):
    """Where and how the job runs on a cluster (read by `hvdk8s render` and `hvdk8s launch`)."""

    namespace: str = "default"
    queue: Optional[str] = Field(default=None, description="Kueue LocalQueue; the job is created suspended")
    service_account: Optional[str] = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for every rank")
    secret_env: dict[str, SecretRef] = Field(default_factory=dict,
                                            description="environment from Secrets, by reference only")
    node_selector: dict[str, str] = Field(default_factory=dict)
    run_as_user: int = Field(default=layout.MPI_UID, ge=1, description="non-root uid of the image's MPI user")
    cache_dir: str = Field(default="/var/cache/hvdk8s", description="node-local dataset cache (hostPath)")
    cache_quota: Optional[ByteQuantity] = Field(default=None, description="evict least recently used datasets "
                                                                      "beyond this size")
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"
    ttl_seconds_after_finished: Optional[int] = Field(default=None, ge=0, le=INT32_MAX)
    backoff_limit: Optional[int] = Field(default=None, ge=0, le=INT32_MAX)
    active_deadline_seconds: Optional[int] = Field(default=None, ge=1, le=2**63 - 1)
    volumes: list[VolumeSpec] = Field(default_factory=list, description="PersistentVolumeClaims, NFS exports or "
                                      "node directories mounted where the ranks run (checkpoints, datasets)")
    pod_security: Optional[PodSecurityLevel] = Field(
        default=None, description="the Pod Security level the namespace enforces: render refuses a job whose "
                                  "pods it would reject")
    priority_class: Optional[str] = Field(default=None, description="PriorityClass of the launcher and workers")
    scheduler_name: Optional[str] = Field(default=None, description="a scheduler other than the default one")
    scheduling_policy: Optional[SchedulingPolicySpec] = Field(
        default=None, description="gang scheduling (Volcano or scheduler-plugins, set up in the MPI operator)")
    tolerations: list[TolerationSpec] = Field(default_factory=list, description="more tolerations for the workers")
    launcher: LauncherSpec = Field(default_factory=LauncherSpec)
    run_launcher_as_worker: bool = Field(default=False, description="single-worker jobs: the launcher pod runs the "
                                                                    "ranks itself (no worker pod, no ssh)")
    worker_wait_seconds: int = Field(default=900, ge=10, le=86400,
                                     description="how long the launcher waits for every worker's sshd to answer")

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names(cls, v: dict) -> dict:
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(bad)}")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return k8s_valid(k8snames.dns1123_label, v)

    @field_validator("queue")
    @classmethod
    def _queue_label(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else k8s_valid(k8snames.label_value, v)  # the kueue.x-k8s.io/queue-name label

    @field_validator("service_account", "priority_class", "scheduler_name")
    @classmethod
    def _object_name(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else k8s_valid(k8snames.dns1123_subdomain, v)

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, v: list) -> list:
        for name in v:
            k8s_valid(k8snames.dns1123_subdomain, name)
        if len(set(v)) != len(v):
            raise ValueError("a Secret is listed twice (the API server refuses repeated imagePullSecrets)")
        return v

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict) -> dict:
        return _label_map(v)

    @field_validator("run_as_user")
    @classmethod
    def _image_user(cls, v: int) -> int:
        # sshd and ssh look the uid up in the image's /etc/passwd, read ~/.sshd_config from the user's home
        # (mode 0750) and write the pid file there: only the uid the image creates can do all three.
        if v != layout.MPI_UID:
            raise ValueError(f"the image's MPI user (mpiuser) is uid {layout.MPI_UID}: sshd and ssh need the "
                             "uid in /etc/passwd and its home; another uid needs an image built for it")
        return v

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        _absolute_path(v)
        clash = [d for d in (*layout.RESERVED_MOUNTS, *layout.IMAGE_DIRS, *layout.SYSTEM_DIRS) if layout.overlaps(v, d)]
        if clash:
            raise ValueError(f"{v} cannot be the dataset cache: it overlaps {clash[0]}")
        return v

    @field_validator("volumes")
    @classmethod
    def _distinct(cls, v: list) -> list:
        for attr in ("name", "mount_path"):
            seen: dict = {}
            for i, volume in enumerate(v):
                value = getattr(volume, attr)
                if value in seen:
                    raise ValueError(f"volumes {seen[value]} and {i} have the same {attr} {value!r}")
                seen[value] = i
        return v

    @model_validator(mode="after")
    def _volumes_beside_the_cache(self) -> "KubernetesSpec":
        for i, volume in enumerate(self.volumes):
            if layout.overlaps(volume.mount_path, self.cache_dir):
                raise ValueError(f"volumes[{i}].mount_path {volume.mount_path} overlaps cache_dir {self.cache_dir}")
            # The node's cache holds every namespace's datasets; a job reaches only its own, through the cache.
            if volume.host_path is not None and layout.overlaps(volume.host_path, self.cache_dir):
                raise ValueError(f"volumes[{i}].host_path {volume.host_path} overlaps cache_dir {self.cache_dir}, "
                                 "the node's dataset cache (datasets come in through `dataset.cache`)")
        return self

    @model_validator(mode="after")
    def _one_scheduler(self) -> "KubernetesSpec":
        if self.scheduler_name and self.scheduling_policy is not None:
            raise ValueError("scheduler_name and scheduling_policy: with gang scheduling the MPI operator sets the "
                             "scheduler (Volcano or scheduler-plugins) and overwrites scheduler_name; give one")
        return self

    @model_validator(mode="after")
    def _env_once(self) -> "KubernetesSpec":
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"{', '.join(both)} in both env and secret_env: a variable comes from one of them")
        return self
