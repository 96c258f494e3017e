"""The job file: one YAML document that describes a training job, validated into a `JobSpec`.

The same JobSpec feeds `hvdk8s train` (each rank), `hvdk8s launch --local` and the cluster side.
Every problem is reported with the field path it concerns (`training.batch_size`) and what is
allowed there; `JobFileError` carries all of them at once.
"""
from __future__ import annotations

import datetime
import posixpath
import re
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from hvdk8s import compression, precision, safeyaml, schedule, suggest, tuning
from hvdk8s._version import __version__
from hvdk8s.overrides import OverrideError, applied
from hvdk8s.errors import UserError
from hvdk8s.data import catalog
from hvdk8s.models import registry
from hvdk8s.quantity import ByteQuantity, Quantity, parse_quantity
from hvdk8s.strict import StrictModel
from hvdk8s import k8snames
from hvdk8s.mpijob import layout

Framework = Literal["pytorch", "tensorflow"]
Precision = Literal[precision.CHOICES]
Compression = Literal[compression.CHOICES]
Tuning = Literal[tuning.PROFILES]

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
# Every rank finds its validated job (defaults filled in) at the path this variable names: a file the
# local launcher writes, or the job's ConfigMap on a cluster. `hvdk8s.job()` reads it.
JOB_ENV = "HVDK8S_JOB"


INT32_MAX = 2**31 - 1  # replicas, slotsPerWorker, Horovod's rank count: 32-bit in the operator and in Horovod
_Strict = StrictModel  # the name the models below (and others' additions) subclass


_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
Task = Literal["classification", "language_model"]


def _import_path(v: Optional[str]) -> Optional[str]:
    if v is not None and not _IMPORT_PATH.match(v):
        raise ValueError(f"{v!r} is not an import path; write 'package.module:function'")
    return v


ImportPath = Annotated[Optional[str], AfterValidator(_import_path)]


class ModelSpec(_Strict):
    name: Optional[str] = Field(default=None, description="registry name: mlp, cnn, resnet or transformer")
    factory: ImportPath = Field(default=None, description="your own model: 'package.module:function' that "
                                                          "returns a torch.nn.Module or a keras.Model")
    task: Optional[Task] = Field(default=None, description="what a factory model does (default classification): "
                                                           "picks the loss and accuracy")
    args: dict[str, Any] = Field(default_factory=dict, description="the model's own arguments")

    @field_validator("name")
    @classmethod
    def _known(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in registry.REGISTRY:
            raise ValueError(f"unknown model {v!r}; {suggest.hint(v, sorted(registry.REGISTRY), 'registered models')} "
                             "(or give `factory` for your own)")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.name is None) == (self.factory is None):
            raise ValueError("give exactly one of `name` (a registered model) or `factory` (your own)")
        if self.name is not None and self.task is not None:
            raise ValueError("`task` is for factory models; a registered model knows its task")
        return self

    @property
    def label(self) -> str:
        return self.name or self.factory

    @property
    def resolved_task(self) -> str:
        return registry.get(self.name).task if self.name else (self.task or "classification")


REMOTE_SCHEMES = ("s3", "http", "https")


# The keys the S3 credentials Secret must hold (the variables botocore reads), and the optional one.
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_SECRET_OPTIONAL_KEYS = ("AWS_SESSION_TOKEN",)


def _data_key(v: str) -> str:
    if not _CONFIGMAP_KEY.match(v):
        raise ValueError(f"{v!r} is not a Secret or ConfigMap key (letters, digits, '-', '_', '.')")
    return v


# The name of a Secret or ConfigMap (a DNS subdomain), and a key of its data.
ObjectName = Annotated[str, AfterValidator(lambda v: _k8s_valid(k8snames.dns1123_subdomain, v))]
DataKey = Annotated[str, AfterValidator(_data_key)]


class CABundleSpec(_Strict):
    """A PEM file of the certificate authorities to trust, from a Secret or a ConfigMap of the job's namespace."""

    secret: Optional[ObjectName] = None
    config_map: Optional[ObjectName] = None
    key: DataKey = Field(default="ca.crt", description="the key holding the PEM text")

    @model_validator(mode="after")
    def _one_source(self) -> "CABundleSpec":
        if (self.secret is None) == (self.config_map is None):
            raise ValueError("give exactly one of `secret` or `config_map` (the object holding the PEM file)")
        return self


class S3Spec(_Strict):
    """An S3-compatible object store. Credentials come from the environment locally
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and from `credentials_secret` on a cluster, where the
    dataset-cache init container also gets the region, the CA bundle and kubernetes.env's proxy variables."""

    endpoint_url: Optional[str] = Field(default=None, description="e.g. https://minio.example.com; AWS if unset")
    credentials_secret: Optional[str] = Field(
        default=None, description=f"Kubernetes Secret with keys {' and '.join(S3_SECRET_KEYS)} (and optionally "
                                  f"{', '.join(S3_SECRET_OPTIONAL_KEYS)}), e.g. kubectl create secret generic NAME "
                                  "--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...")
    region: Optional[str] = Field(default=None, description="AWS_REGION of the bucket, e.g. eu-west-1 (AWS's "
                                                            "default region if unset)")
    ca_bundle: Optional[CABundleSpec] = Field(
        default=None, description="certificate authorities for an endpoint with a private CA: {secret or "
                                  "config_map, key}; mounted in the sync container as AWS_CA_BUNDLE")

    @field_validator("region")
    @classmethod
    def _region(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"[a-z0-9][-a-z0-9]{0,62}", v):
            raise ValueError(f"{v!r} is not a region name (e.g. us-east-1)")
        return v


class DatasetSpec(_Strict):
    name: Optional[str] = Field(default=None, description="a built-in dataset: " + ", ".join(catalog.BUILTIN))
    factory: ImportPath = Field(default=None, description="your own data: 'package.module:function' returning "
                                                          "(x, y) arrays, a map-style dataset, or {train:, test:}")
    path: Optional[str] = Field(default=None, description="a directory in the hvdk8s shard format: a local or NFS "
                                                        "path, s3://bucket/prefix or an http(s):// URL")
    version: Optional[str] = Field(default=None, description="part of the cache key: a new version is a new copy")
    cache: Optional[bool] = Field(default=None, description="sync onto node-local disk before training "
                                                            "(default: yes for s3:// and http(s):// sources)")
    s3: S3Spec = Field(default_factory=S3Spec)
    args: dict[str, Any] = Field(default_factory=dict, description="arguments of the built-in dataset or factory")
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0,
                                 description="held-out share of a built-in or factory dataset without its own split")
    splits: dict[Literal["train", "test"], str] = Field(
        default_factory=lambda: {"train": "train", "test": "test"},
        description="sub-directory of `path` holding each split's shards and index")

    @field_validator("name")
    @classmethod
    def _known(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in catalog.BUILTIN:
            raise ValueError(f"unknown dataset {v!r}; {suggest.hint(v, catalog.BUILTIN, 'built-in datasets')} "
                             "(or give `path` to a dataset in the shard format)")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetSpec":
        if sum(v is not None for v in (self.name, self.path, self.factory)) != 1:
            raise ValueError("give exactly one of `name` (a built-in dataset), `path` (shard format) or `factory` "
                             "(your own)")
        if self.path is not None and self.args:
            raise ValueError("`args` applies to built-in datasets only; a `path` dataset is described by its index")
        if self.path is None and self.cache:
            raise ValueError("`cache` applies to `path` datasets; built-in and factory datasets are not synced")
        scheme = self.path.split("://", 1)[0] if self.path and "://" in self.path else None
        if scheme is not None and scheme not in REMOTE_SCHEMES + ("file",):
            raise ValueError(f"path scheme {scheme!r} is not supported; use a local path, s3:// or http(s)://")
        if self.remote and self.cache is False:
            raise ValueError(f"a {scheme}:// dataset is read from the node-local cache; remove `cache: false`")
        return self

    @property
    def label(self) -> str:
        return self.name or self.path or self.factory

    @property
    def remote(self) -> bool:
        return bool(self.path) and self.path.split("://", 1)[0] in REMOTE_SCHEMES and "://" in self.path

    @property
    def cached(self) -> bool:
        """Whether training reads a node-local copy (synced before the ranks start)."""
        return self.cache if self.cache is not None else self.remote


class CheckpointSpec(_Strict):
    dir: Optional[str] = Field(default=None, description="where rank 0 writes checkpoints; none: no checkpoints")
    interval_epochs: int = Field(default=1, gt=0, le=1_000_000)
    keep: int = Field(default=3, ge=1, description="newest checkpoints kept")


class ElasticSpec(_Strict):
    """Horovod elastic training: the job keeps training while workers leave and join, between these bounds.
    A worker is a pod on a cluster (resources.ranks_per_worker ranks each) and one rank in a local launch."""

    min_workers: int = Field(ge=1, le=INT32_MAX, description="fewer than this: the job waits, then fails")
    max_workers: int = Field(ge=1, le=INT32_MAX, description="more are not used")
    commit_every_steps: int = Field(default=20, ge=1, le=1_000_000,
                                    description="optimizer steps between in-memory commits of the state; a "
                                                "failure loses at most this many")

    @model_validator(mode="after")
    def _bounds(self) -> "ElasticSpec":
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is more than max_workers ({self.max_workers})")
        return self


# Fields hvdk8s's trainer cannot do without; a script job (`entrypoint`) may leave them out (or the whole
# `training` block): its script reads what it wants of them through hvdk8s.job().
TRAINER_REQUIRED = ("epochs", "batch_size", "learning_rate")


class TrainingSpec(_Strict):
    epochs: Optional[int] = Field(default=None, gt=0, le=1_000_000,
                                  description="required for hvdk8s's trainer; a script job may leave it out")
    batch_size: Optional[int] = Field(default=None, gt=0, le=1 << 24,
                                      description="samples per rank per backward pass (required for hvdk8s's "
                                                  "trainer)")
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    learning_rate: Optional[float] = Field(default=None, gt=0.0, allow_inf_nan=False,
                                           description="for one rank; scaled by lr_scaling (required for "
                                                       "hvdk8s's trainer)")
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    lr_scaling: Literal[schedule.LR_SCALING] = Field(
        default="linear", description="how the learning rate grows with the number of ranks")
    warmup_epochs: float = Field(default=0.0, ge=0.0, le=1_000_000, allow_inf_nan=False,
                                 description="epochs over which the rate ramps from learning_rate to its scaled value")
    compression: Compression = Field(
        default="auto", description="gradient compression: auto picks fp16 only where gradients cross a "
                                    "network between GPU nodes")
    backward_passes_per_step: int = Field(default=1, ge=1)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="seeds numpy, torch and Keras (32 bits)")
    precision: Precision = Field(default="fp32", description="fp32, or mixed precision: bf16, or fp16 with loss "
                                                             "scaling")
    stall_timeout_seconds: Optional[int] = Field(
        default=600, ge=5, le=86_400, description="end the job when a rank hangs this long in a collective "
                                                  "(Horovod's stall check; null: wait forever)")
    clip_grad_norm: Optional[float] = Field(default=None, gt=0.0, allow_inf_nan=False,
                                            description="clip the averaged gradients to this global L2 norm")
    elastic: Optional[ElasticSpec] = Field(default=None, description="train on while workers leave and join "
                                                                    "(Horovod elastic, Gloo)")
    shard_optimizer_state: Literal[0, 1, 2] = Field(
        default=0, description="0: every rank holds the whole optimizer state; 1: each rank holds 1/N of it "
                               "(ZeRO stage 1); 2: the gradients too (stage 2). PyTorch")

    @field_validator("shard_optimizer_state", mode="before")
    @classmethod
    def _stage_not_boolean(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML's true would pass as 1
            raise ValueError(f"a stage, 0, 1 or 2, not {str(v).lower()}")
        return v


class RDMASpec(_Strict):
    """RDMA / RoCE networking for NCCL between nodes."""

    enabled: bool = False
    resource: str = Field(default="rdma/rdma_shared_device_a",
                          description="device-plugin resource each worker requests (SR-IOV: e.g. nvidia.com/hostdev)")
    count: int = Field(default=1, ge=1, le=2**31 - 1)
    networks: Optional[str] = Field(default=None, description="Multus k8s.v1.cni.cncf.io/networks annotation")
    hca: Optional[str] = Field(default=None, description="NCCL_IB_HCA, e.g. mlx5")
    gid_index: int = Field(default=3, ge=0, description="NCCL_IB_GID_INDEX (3: RoCE v2 on most NICs)")
    gdr_level: Optional[str] = Field(default=None, description="NCCL_NET_GDR_LEVEL, e.g. PHB")
    socket_ifname: str = Field(default="eth0", description="NCCL_SOCKET_IFNAME: the pod interface for sockets")

    @field_validator("resource")
    @classmethod
    def _resource_name(cls, v: str) -> str:
        if not _RESOURCE.match(v) or k8snames.qualified_name(v):
            raise ValueError(f"{v!r} is not an extended resource name (domain/name, e.g. rdma/rdma_shared_device_a)")
        return v

    @field_validator("socket_ifname")
    @classmethod
    def _interface(cls, v: str) -> str:
        return _k8s_valid(k8snames.interface_name, v)

    @field_validator("networks")
    @classmethod
    def _networks(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            k8snames.multus_interfaces(v)
        return v

    @model_validator(mode="after")
    def _socket_interface_exists(self) -> "RDMASpec":
        if self.socket_ifname not in self.pod_interfaces:
            raise ValueError(f"socket_ifname {self.socket_ifname!r} is not an interface of the worker pods, which "
                             f"have {', '.join(self.pod_interfaces)} (eth0 is the pod network; net1... come from "
                             "Multus `networks`, attached with RDMA on)")
        return self

    @property
    def pod_interfaces(self) -> list[str]:
        """Interfaces of a worker pod (no hostNetwork): the pod network's eth0, then each Multus network's."""
        return ["eth0", *(k8snames.multus_interfaces(self.networks) if self.enabled and self.networks else [])]




def _k8s_valid(check, value: str) -> str:
    """VALUE if the k8snames CHECK finds nothing wrong, else ValueError with what it found."""
    problems = check(value)
    if problems:
        raise ValueError("; ".join(problems))
    return value


SHM_DEFAULT_MAX = 8 * 2**30  # a worker pod's /dev/shm by default: half its memory, at most this
# `gpus` counts the whole job; these are each worker pod's (messages and `validate --print` say so).
PER_WORKER_POD = ("cpu", "memory", "shm_size")


def _as_quantity(amount: Decimal) -> str:
    """Bytes as the shortest exact quantity: 8Gi, 1536Mi, 1000 (whole bytes, rounded down)."""
    whole = int(amount)
    for suffix, power in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if whole and whole % 2**power == 0:
            return f"{whole >> power}{suffix}"
    return str(whole)


def _default_shm_size(fields: dict) -> str:
    """Half the worker pod's memory, at most 8Gi: /dev/shm is memory-backed and counts against the limit.
    (Called only when the fields before it are valid.)"""
    return _as_quantity(min(parse_quantity(fields["memory"]) / 2, Decimal(SHM_DEFAULT_MAX)))


class ResourcesSpec(_Strict):
    """What the job asks of a cluster. `gpus` is the whole job's; cpu, memory and shm_size are each worker pod's
    (a GPU job has one worker pod per node, holding min(gpus, gpus_per_node) GPUs)."""

    gpus: int = Field(default=0, ge=0, description="GPUs of the whole job, over all its worker pods (0: a CPU job)")
    gpus_per_node: int = Field(default=8, ge=1, le=INT32_MAX,
                               description="GPUs on each node; each worker pod takes min(gpus, gpus_per_node) of "
                                           "them (gpus: 2 on 8-GPU nodes: one worker pod with 2 GPUs)")
    gpu_product: Optional[str] = Field(default=None, description="nodeSelector on nvidia.com/gpu.product")
    workers: Optional[int] = Field(default=None, ge=1, le=INT32_MAX,
                                   description="worker pods; derived from gpus for GPU jobs, default 1 for CPU jobs")
    ranks_per_worker: int = Field(default=1, ge=1, le=INT32_MAX, description="ranks in each worker pod of a CPU job")
    cpu: Quantity = Field(default="4", description="CPU of each worker pod, not the job's total (Kubernetes "
                                                   "quantity)")
    memory: Quantity = Field(default="16Gi", description="memory limit of each worker pod, not the job's total "
                                                         "(Kubernetes quantity); shm_size counts against it")
    shm_size: Quantity = Field(default_factory=_default_shm_size,
                               description="/dev/shm of each worker pod (NCCL and loaders outgrow 64Mi): "
                                           "memory-backed, so at most `memory`; default half of memory, at most "
                                           "8Gi")
    rdma: RDMASpec = Field(default_factory=RDMASpec)
    hierarchical_allreduce: bool = Field(
        default=False, description="Horovod's hierarchical allreduce (NCCL in each node, MPI over TCP between "
                                   "nodes): only for multi-node GPU jobs without RDMA, where you measured it helps")
    tuning: Tuning = Field(
        default="auto", description="the ranks' tuning profile (hvdk8s/tuning.py): shared-cpu (Open MPI yields when "
                                    "idle, malloc thresholds, the sleepy negotiation, a single rank's 20 ms cycle), "
                                    "none, or auto: shared-cpu for CPU jobs and local launches without a GPU, none "
                                    "for GPU jobs")

    @field_validator("gpu_product")
    @classmethod
    def _label_value(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _k8s_valid(k8snames.label_value, v)

    @model_validator(mode="after")
    def _fits_32_bits(self) -> "ResourcesSpec":
        workers = self.gpus // min(self.gpus, self.gpus_per_node) if self.gpus else (self.workers or 1)
        slots = min(self.gpus, self.gpus_per_node) if self.gpus else self.ranks_per_worker
        if max(workers, slots, workers * slots) > INT32_MAX:
            raise ValueError(f"{workers} workers x {slots} ranks is beyond what the MPI operator and Horovod count "
                             f"(at most {INT32_MAX} workers, ranks per worker and ranks)")
        return self

    @field_validator("shm_size")
    @classmethod
    def _shm_within_memory(cls, v: str, info: ValidationInfo) -> str:
        memory = info.data.get("memory")  # validated before shm_size; absent when itself invalid
        if memory is not None and parse_quantity(v) > parse_quantity(memory):
            raise ValueError(f"resources.shm_size ({v}) is more than resources.memory ({memory}), both per worker "
                             "pod: /dev/shm is memory-backed and counts against the pod's memory limit; lower "
                             "shm_size or raise memory")
        return v

    @model_validator(mode="after")
    def _hierarchical_where_it_can_help(self) -> "ResourcesSpec":
        if not self.hierarchical_allreduce:
            return self
        if not self.gpus or self.gpus <= self.gpus_per_node:
            raise ValueError("hierarchical_allreduce is for GPU jobs on more than one node (gpus > gpus_per_node)")
        if self.rdma.enabled:
            raise ValueError("hierarchical_allreduce with rdma: Horovod 0.28.1 would do the cross-node step as a "
                             "host-memory MPI allreduce over TCP instead of NCCL over RDMA; leave it off")
        return self

    @field_validator("rdma", mode="before")
    @classmethod
    def _rdma_flag(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _whole_nodes(self) -> "ResourcesSpec":
        if self.gpus:
            per_node = min(self.gpus, self.gpus_per_node)
            if self.gpus % per_node:
                raise ValueError(f"gpus ({self.gpus}) do not fill whole nodes of gpus_per_node "
                                 f"({self.gpus_per_node}); use a multiple of {self.gpus_per_node}")
            if self.workers is not None and self.workers != self.gpus // per_node:
                raise ValueError(f"workers ({self.workers}) disagrees with gpus / gpus_per_node "
                                 f"({self.gpus // per_node}); leave workers out for GPU jobs")
        return self


class SecretRef(_Strict):
    secret: ObjectName
    key: DataKey


def _absolute_path(v: str) -> str:
    if not v.startswith("/") or "//" in v or "\0" in v or posixpath.normpath(v) != v:
        raise ValueError(f"{v!r} must be an absolute, normalized path (no '..', '.', '//' or trailing '/')")
    return v


class NFSVolumeSpec(_Strict):
    server: str = Field(description="the NFS server's host name or IP address")
    path: str = Field(description="the exported directory on the server")

    @field_validator("server")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v or any(c.isspace() or c == "/" for c in v):
            raise ValueError(f"{v!r} is not a host name or IP address")
        return v

    _path = field_validator("path")(_absolute_path)


class VolumeSpec(_Strict):
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
        _k8s_valid(k8snames.dns1123_label, v)
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
        return v if v is None else _k8s_valid(k8snames.dns1123_subdomain, v)

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


class TolerationSpec(_Strict):
    """A Kubernetes toleration: lets pods run on nodes with a matching taint."""

    key: Optional[str] = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Optional[str] = None
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = None
    toleration_seconds: Optional[int] = Field(default=None, ge=0, description="NoExecute only: how long to stay")

    @field_validator("key")
    @classmethod
    def _key(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _k8s_valid(k8snames.qualified_name, v)

    @model_validator(mode="after")
    def _as_the_api_server_requires(self) -> "TolerationSpec":
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without `key` must have operator Exists (it tolerates every taint)")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no `value`")
        if self.operator == "Equal" and self.value is not None:
            _k8s_valid(k8snames.label_value, self.value)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds needs effect NoExecute")
        return self


class LauncherSpec(_Strict):
    """Where the launcher pod (mpirun, no GPU) may run."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[TolerationSpec] = Field(default_factory=list)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict) -> dict:
        return _label_map(v)


class SchedulingPolicySpec(_Strict):
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
        return v if v is None else _k8s_valid(k8snames.dns1123_subdomain, v)


def _label_map(v: dict) -> dict:
    problems = k8snames.labels(v)
    if problems:
        raise ValueError("; ".join(p for _, p in problems))
    return v


PodSecurityLevel = Literal["restricted", "baseline", "privileged"]


class KubernetesSpec(_Strict):
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
        return _k8s_valid(k8snames.dns1123_label, v)

    @field_validator("queue")
    @classmethod
    def _queue_label(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _k8s_valid(k8snames.label_value, v)  # the kueue.x-k8s.io/queue-name label

    @field_validator("service_account", "priority_class", "scheduler_name")
    @classmethod
    def _object_name(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _k8s_valid(k8snames.dns1123_subdomain, v)

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, v: list) -> list:
        for name in v:
            _k8s_valid(k8snames.dns1123_subdomain, name)
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


class EntrypointSpec(_Strict):
    """Your own training script or module, started on every rank in place of `hvdk8s train`."""

    script: Optional[str] = Field(default=None, description="a Python file (relative to the job file's folder)")
    module: Optional[str] = Field(default=None, description="a module run as `python -m MODULE`")
    args: list[Union[str, int, float]] = Field(default_factory=list, description="its command-line arguments")
    code: Optional[Literal["configmap", "image"]] = Field(
        default=None, description="on a cluster: carry the script in the job's ConfigMap (default for scripts) "
                                  "or find it in the image (`script` is then its path there; modules always)")

    @field_validator("module")
    @classmethod
    def _dotted(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _MODULE.match(v):
            raise ValueError(f"{v!r} is not a module name (e.g. my_pkg.train)")
        return v

    @field_validator("args", mode="before")
    @classmethod
    def _strings(cls, v: Any) -> Any:
        if isinstance(v, list) and any(isinstance(a, bool) for a in v):  # YAML's yes/true: say so, not "1"
            raise ValueError("arguments are strings; quote true/false")
        return v

    @field_validator("args")
    @classmethod
    def _as_text(cls, v: list) -> list:
        return [str(a) for a in v]

    @model_validator(mode="after")
    def _one(self) -> "EntrypointSpec":
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of `script` (a Python file) or `module`")
        if self.module is not None and self.code == "configmap":
            raise ValueError("`code: configmap` carries a script; a module must be installed in the image")
        if self.script is not None and ("\0" in self.script or not self.script.strip()):
            raise ValueError("`script` must be a file path")
        if self.carried and (not _CONFIGMAP_KEY.match(self.script_name) or self.script_name == "job.yaml"):
            raise ValueError(f"the script's file name {self.script_name!r} must be letters, digits, '-', '_' or '.' "
                             "(it becomes a key of the job's ConfigMap), and not job.yaml")
        return self

    @property
    def script_name(self) -> str:
        return Path(self.script).name if self.script else ""

    @property
    def carried(self) -> bool:
        """Whether a cluster gets the script through the job's ConfigMap (else it is in the image)."""
        return self.script is not None and (self.code or "configmap") == "configmap"


class MetricsSpec(_Strict):
    """Prometheus metrics from every rank (see hvdk8s/metrics.py for what is exported)."""

    enabled: Optional[bool] = Field(default=None, description="serve them (default: on in cluster runs, off in "
                                                               "local ones)")
    port: int = Field(default=9400, ge=1024, le=65535, description="each node's first rank serves every rank of "
                                                                   "the node here; rank i of a node also uses "
                                                                   "port+i on loopback")
    pod_monitor: bool = Field(default=False, description="`hvdk8s render` also writes a PodMonitor for the "
                                                         "Prometheus Operator")
    scrape_interval_seconds: int = Field(default=15, ge=1, le=3600, description="the PodMonitor's interval")
    first_scrape_timeout_seconds: int = Field(
        default=0, ge=0, le=3600, description="before training, each rank waits until Prometheus has scraped "
                                              "its zero counts, at most this long (a job shorter than two "
                                              "scrape intervals otherwise leaves its rates without a "
                                              "baseline); 0: the ranks start at once")
    final_scrape_timeout_seconds: int = Field(
        default=0, ge=0, le=3600, description="after training, each rank keeps serving until Prometheus has "
                                              "scraped its final values, waiting at most this long (a job "
                                              "shorter than a scrape interval otherwise leaves no series); 0: "
                                              "the ranks end at once")


TIMELINE_FILE = "horovod-timeline.json"
AUTOTUNE_FILE = "horovod-autotune.csv"
TENSORBOARD_DIR = "tensorboard"


class ObservabilitySpec(_Strict):
    """Metrics, Horovod's timeline and autotuning, TensorBoard scalars."""

    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    dir: Optional[str] = Field(default=None, description="the run directory: timeline, autotune log and "
                                                         "TensorBoard events (default: training.checkpoint.dir)")
    timeline: bool = Field(default=False, description=f"Horovod's timeline (Chrome trace) as DIR/{TIMELINE_FILE}")
    autotune: bool = Field(default=False, description=f"Horovod's autotuning, its log as DIR/{AUTOTUNE_FILE}")
    tensorboard: bool = Field(default=False, description=f"rank 0's scalars under DIR/{TENSORBOARD_DIR}")

    @field_validator("dir")
    @classmethod
    def _a_path(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and ("\0" in v or not v.strip()):
            raise ValueError("must be a directory path")
        return v

    @property
    def wanted(self) -> list[str]:
        """The switches that write into the run directory."""
        return [f for f in ("timeline", "autotune", "tensorboard") if getattr(self, f)]


IMAGE_REPOSITORY = "ghcr.io/hvdk8s/hvdk8s"
# How each default image is built (Dockerfile.gpu's DEVICE argument picks CUDA or plain Ubuntu).
IMAGE_BUILDS = {"gpu": "docker build -f Dockerfile.gpu -t {image} .",
                "cpu": "docker build -f Dockerfile.gpu --build-arg DEVICE=cpu -t {image} ."}


def default_image(resources: ResourcesSpec) -> str:
    """hvdk8s's image for a job without `image:`: a CPU job gets the CPU build, not gigabytes of CUDA."""
    device = "gpu" if resources.gpus else "cpu"
    return f"{IMAGE_REPOSITORY}-{device}:{__version__}"


class JobSpec(_Strict):
    name: str = Field(description="job name: lower-case letters, digits and '-', starting with a letter")
    framework: Framework
    entrypoint: Optional[EntrypointSpec] = Field(default=None, description="your own script or module instead "
                                                                           "of hvdk8s's trainer")
    model: Optional[ModelSpec] = Field(default=None, description="required unless an entrypoint brings its own")
    dataset: Optional[DatasetSpec] = Field(default=None, description="required unless an entrypoint brings its own")
    training: TrainingSpec = Field(default_factory=TrainingSpec,
                                   description="hvdk8s's trainer needs epochs, batch_size and learning_rate; a "
                                               "script job needs no training block")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    image: str = Field(default_factory=lambda fields: default_image(fields["resources"]),
                       description="the container image of every pod; default: hvdk8s's GPU image for a GPU job, "
                                   "its CPU image for a CPU job (both built from Dockerfile.gpu)")

    @field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if len(v) > 40 or not _NAME.match(v):
            raise ValueError("must be at most 40 lower-case letters, digits or '-', start with a letter and "
                             "not end with '-' (it names Kubernetes objects)")
        return v

    @model_validator(mode="after")
    def _trainer_needs(self) -> "JobSpec":
        if self.entrypoint is None and (self.model is None or self.dataset is None):
            missing = " and ".join(f"`{f}`" for f in ("model", "dataset") if getattr(self, f) is None)
            raise ValueError(f"{missing} required: hvdk8s's trainer needs them (or give an `entrypoint`)")
        return self

    @property
    def run_dir(self) -> Optional[str]:
        """Where the timeline, the autotune log and TensorBoard's events go."""
        return self.observability.dir or self.training.checkpoint.dir

    def run_file(self, name: str) -> Optional[str]:
        d = self.run_dir
        return None if d is None else posixpath.join(d, name) if d.startswith("/") else str(Path(d) / name)

    @property
    def cached_dataset(self) -> Optional[DatasetSpec]:
        """The dataset when it is a `path` read from the node-local cache (synced before the ranks start)."""
        d = self.dataset
        return d if d is not None and d.path is not None and d.cached else None

    @property
    def summary(self) -> str:
        """What runs, in a few words (for messages)."""
        if self.entrypoint is not None:
            return f"{self.framework} script {self.entrypoint.script or '-m ' + self.entrypoint.module}"
        return f"{self.framework} {self.model.label} on {self.dataset.label}"


class JobFileError(UserError):
    """A job file that cannot be used; `problems` lists (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        super().__init__(f"{source}: invalid job file", problems)


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed at `loc` (for 'unknown field' messages)."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        ann = getattr(field, "annotation", None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return list(model.model_fields)


def _choices(error: dict) -> list[str]:
    """The values a Literal field allows, from pydantic's error (`'sgd', 'adam' or 'adamw'`)."""
    return re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))


def _unquoted(value: Any) -> Optional[str]:
    """For a text field given what YAML reads an unquoted date, number or yes/no as: say to quote it."""
    if isinstance(value, bool):
        return "YAML reads an unquoted true/false, yes/no or on/off as a boolean, not text: quote it"
    if isinstance(value, datetime.date):
        return f'YAML reads an unquoted {value.isoformat()} as a date, not text: quote it ("{value.isoformat()}")'
    if isinstance(value, (int, float)):
        return (f"YAML reads this unquoted value as the number {value!r}, not text (1.10 reads as 1.1, 010 as 8): "
                "quote it as you wrote it")
    return None


def _problems(err: ValidationError, model: type[BaseModel], prefix: tuple = ()) -> list[tuple[str, str]]:
    out = []
    for e in err.errors(include_url=False):
        if e["type"] == "default_factory_not_called":
            continue  # a default derived from other fields (image, shm_size), which have their own errors
        loc = prefix + tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(model, tuple(e["loc"])[:-1])
            msg = "unknown field" + (f"; {suggest.hint(loc[-1], allowed, 'allowed here')}" if allowed else "")
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "literal_error" and (meant := suggest.closest(str(e["input"]), _choices(e))):
            msg = f"{e['input']!r} is not a choice here; did you mean {meant!r}?"
        elif e["type"] == "string_type" and _unquoted(e["input"]):
            msg = _unquoted(e["input"])
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] not in ("value_error", "assertion_error") and "input" in e:
                msg += f" (got {e['input']!r})"
        out.append((_path(loc), msg))
    return out


def with_backend_defaults(spec: JobSpec, cluster: bool) -> JobSpec:
    """The job as a back end hands it to its ranks: what the job file leaves to the back end decided
    (metrics: on in cluster runs, off in local ones)."""
    m = spec.observability.metrics
    if m.enabled is not None:
        return spec
    metrics = m.model_copy(update={"enabled": cluster})
    return spec.model_copy(update={"observability": spec.observability.model_copy(update={"metrics": metrics})})


def _cross_checks(spec: JobSpec) -> list[tuple[str, str]]:
    """Rules that span fields: each model's and dataset's own arguments, and their pairing."""
    problems = []
    if spec.entrypoint is None:
        problems += [(f"training.{f}", "required field is missing (hvdk8s's trainer reads it; only a script job, "
                                       "with `entrypoint`, may leave it out)")
                     for f in TRAINER_REQUIRED if getattr(spec.training, f) is None]
    if spec.run_dir is None:
        problems += [(f"observability.{f}", "needs a run directory: set observability.dir (or "
                                            "training.checkpoint.dir)") for f in spec.observability.wanted]
    m = spec.observability.metrics
    if m.pod_monitor and m.enabled is False:
        problems.append(("observability.metrics.pod_monitor", "a PodMonitor scrapes the ranks' metrics, which "
                                                              "observability.metrics.enabled: false turns off; "
                                                              "drop one of the two"))
    if spec.training.shard_optimizer_state and spec.framework != "pytorch":
        problems.append(("training.shard_optimizer_state", "not yet available for tensorflow (pytorch only); set 0"))
    entry = registry.get(spec.model.name) if spec.model is not None and spec.model.name else None
    if entry is not None:
        try:
            entry.args(**spec.model.args)
        except ValidationError as e:
            problems += _problems(e, entry.args, ("model", "args"))
        if spec.framework not in entry.builders:
            problems.append(("framework", f"model {entry.name!r} is not yet available for {spec.framework} "
                                          f"(available for: {', '.join(sorted(entry.builders))})"))
    if spec.dataset is not None and spec.dataset.name:
        args_model, task = catalog.BUILTIN[spec.dataset.name]
        try:
            args_model(**spec.dataset.args)
        except ValidationError as e:
            problems += _problems(e, args_model, ("dataset", "args"))
        model_task = spec.model.resolved_task if spec.model is not None else task
        if task != model_task:
            problems.append(("dataset.name", f"dataset {spec.dataset.name!r} feeds {task.replace('_', ' ')} "
                                             f"models, but model {spec.model.label!r} is a "
                                             f"{model_task.replace('_', ' ')} model"))
    return problems


def parse_job(data: Any, source: str = "<job>") -> JobSpec:
    """Validate an already-loaded job document (a dict)."""
    if not isinstance(data, dict):
        raise JobFileError(source, [("", f"expected a mapping of fields, got {type(data).__name__}")])
    try:
        spec = JobSpec(**data)
    except ValidationError as e:
        raise JobFileError(source, _problems(e, JobSpec)) from None
    problems = _cross_checks(spec)
    if problems:
        raise JobFileError(source, problems)
    return spec


def apply_overrides(data: dict, overrides: list[str], source: str) -> dict:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a job document, returning a copy."""
    try:
        return applied(data, overrides)
    except OverrideError as e:
        raise JobFileError(source, [(e.field, e.message)]) from None


def load_job(path: Union[str, Path], overrides: Optional[list[str]] = None) -> JobSpec:
    """Read and validate a job file. Raises JobFileError (never a bare YAML or pydantic error)."""
    path = Path(path)
    source = str(path)
    try:
        docs = safeyaml.read(path)
    except FileNotFoundError:
        raise JobFileError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise JobFileError(source, [("", "is a directory, not a job file")]) from None
    except OSError as e:
        raise JobFileError(source, [("", f"cannot read: {e.strerror or e}")]) from None
    except safeyaml.YAMLInputError as e:
        raise JobFileError(source, [("", str(e))]) from None
    if len(docs) != 1:
        raise JobFileError(source, [("", f"expected exactly one YAML document, found {len(docs)}")])
    data = docs[0]
    if overrides:
        if not isinstance(data, dict):
            raise JobFileError(source, [("", "expected a mapping of fields")])
        data = apply_overrides(data, overrides, source)
    return parse_job(data, source)


def dump_job(spec: JobSpec) -> str:
    """The job as canonical YAML (defaults filled in, stable key order)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


_current: dict[str, JobSpec] = {}


def current_job() -> JobSpec:
    """The job this process runs as a rank of (see JOB_ENV); read and validated once per process."""
    import os

    path = os.environ.get(JOB_ENV)
    if not path:
        raise JobFileError(JOB_ENV, [("", "not set: start this script through `hvdk8s launch` (locally: "
                                          "--local -np N) or a rendered MPIJob, or set it to a job file")])
    if path not in _current:
        _current[path] = load_job(path)
    return _current[path]
