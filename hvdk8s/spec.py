"""The job file: one YAML document that describes a training job, validated into a `JobSpec`.

The same JobSpec feeds `hvdk8s train` (each rank), `hvdk8s launch --local` and the cluster side.
Every problem is reported with the field path it concerns (`training.batch_size`) and what is
allowed there; `JobFileError` carries all of them at once.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, Field, ValidationError, field_validator,
                      model_validator)

from hvdk8s import compression, precision, safeyaml
from hvdk8s.errors import UserError
from hvdk8s.data import catalog
from hvdk8s.models import registry
from hvdk8s.quantity import ByteQuantity, Quantity
from hvdk8s.strict import StrictModel

Framework = Literal["pytorch", "tensorflow"]
Precision = Literal[precision.CHOICES]
Compression = Literal[compression.CHOICES]

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
# Every rank finds its validated job (defaults filled in) at the path this variable names: a file the
# local launcher writes, or the job's ConfigMap on a cluster. `hvdk8s.job()` reads it.
JOB_ENV = "HVDK8S_JOB"


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
            raise ValueError(f"unknown model {v!r}; registered models: {', '.join(sorted(registry.REGISTRY))} "
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


class S3Spec(_Strict):
    """An S3-compatible object store. Credentials come from the environment locally
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and from `credentials_secret` on a cluster."""

    endpoint_url: Optional[str] = Field(default=None, description="e.g. https://minio.example.com; AWS if unset")
    credentials_secret: Optional[str] = Field(
        default=None, description="Kubernetes Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")


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
            raise ValueError(f"unknown dataset {v!r}; built-in datasets: {', '.join(catalog.BUILTIN)} "
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


class TrainingSpec(_Strict):
    epochs: int = Field(gt=0, le=1_000_000)
    batch_size: int = Field(gt=0, le=1 << 24, description="samples per rank per backward pass")
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    learning_rate: float = Field(gt=0.0, allow_inf_nan=False, description="for one rank; scaled by lr_scaling")
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    lr_scaling: Literal["linear", "sqrt", "none"] = Field(
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
    clip_grad_norm: Optional[float] = Field(default=None, gt=0.0, allow_inf_nan=False,
                                            description="clip the averaged gradients to this global L2 norm")


class RDMASpec(_Strict):
    """RDMA / RoCE networking for NCCL between nodes."""

    enabled: bool = False
    resource: str = Field(default="rdma/rdma_shared_device_a",
                          description="device-plugin resource each worker requests (SR-IOV: e.g. nvidia.com/hostdev)")
    count: int = Field(default=1, ge=1)
    networks: Optional[str] = Field(default=None, description="Multus k8s.v1.cni.cncf.io/networks annotation")
    hca: Optional[str] = Field(default=None, description="NCCL_IB_HCA, e.g. mlx5")
    gid_index: int = Field(default=3, ge=0, description="NCCL_IB_GID_INDEX (3: RoCE v2 on most NICs)")
    gdr_level: Optional[str] = Field(default=None, description="NCCL_NET_GDR_LEVEL, e.g. PHB")
    socket_ifname: str = Field(default="eth0", description="NCCL_SOCKET_IFNAME: the pod interface for sockets")

    @field_validator("resource")
    @classmethod
    def _resource_name(cls, v: str) -> str:
        if not _RESOURCE.match(v):
            raise ValueError(f"{v!r} is not an extended resource name (domain/name, e.g. rdma/rdma_shared_device_a)")
        return v


class ResourcesSpec(_Strict):
    gpus: int = Field(default=0, ge=0, description="GPUs for the whole job (0: a CPU job)")
    gpus_per_node: int = Field(default=8, ge=1, description="GPUs on each node; one worker pod takes them all")
    gpu_product: Optional[str] = Field(default=None, description="nodeSelector on nvidia.com/gpu.product")
    workers: Optional[int] = Field(default=None, ge=1,
                                   description="worker pods; derived from gpus for GPU jobs, default 1 for CPU jobs")
    ranks_per_worker: int = Field(default=1, ge=1, description="ranks in each worker pod of a CPU job")
    cpu: Quantity = Field(default="4", description="CPU per worker (Kubernetes quantity)")
    memory: Quantity = Field(default="16Gi", description="memory per worker (Kubernetes quantity)")
    shm_size: Quantity = Field(default="8Gi", description="/dev/shm per worker (NCCL and loaders outgrow 64Mi)")
    rdma: RDMASpec = Field(default_factory=RDMASpec)

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
    secret: str
    key: str


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
    run_as_user: int = Field(default=1000, ge=1, description="non-root uid of the image's MPI user")
    cache_dir: str = Field(default="/var/cache/hvdk8s", description="node-local dataset cache (hostPath)")
    cache_quota: Optional[ByteQuantity] = Field(default=None, description="evict least recently used datasets "
                                                                      "beyond this size")
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"
    ttl_seconds_after_finished: Optional[int] = Field(default=None, ge=0)
    backoff_limit: Optional[int] = Field(default=None, ge=0)
    active_deadline_seconds: Optional[int] = Field(default=None, ge=1)

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names(cls, v: dict) -> dict:
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(bad)}")
        return v


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


class JobSpec(_Strict):
    name: str = Field(description="job name: lower-case letters, digits and '-', starting with a letter")
    framework: Framework
    entrypoint: Optional[EntrypointSpec] = Field(default=None, description="your own script or module instead "
                                                                           "of hvdk8s's trainer")
    model: Optional[ModelSpec] = Field(default=None, description="required unless an entrypoint brings its own")
    dataset: Optional[DatasetSpec] = Field(default=None, description="required unless an entrypoint brings its own")
    training: TrainingSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    image: str = "ghcr.io/hvdk8s/hvdk8s-gpu:0.1.0"

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


def _problems(err: ValidationError, model: type[BaseModel], prefix: tuple = ()) -> list[tuple[str, str]]:
    out = []
    for e in err.errors(include_url=False):
        loc = prefix + tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(model, tuple(e["loc"])[:-1])
            msg = "unknown field" + (f"; allowed here: {', '.join(allowed)}" if allowed else "")
        elif e["type"] == "missing":
            msg = "required field is missing"
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] not in ("value_error", "assertion_error") and "input" in e:
                msg += f" (got {e['input']!r})"
        out.append((_path(loc), msg))
    return out


def _cross_checks(spec: JobSpec) -> list[tuple[str, str]]:
    """Rules that span fields: each model's and dataset's own arguments, and their pairing."""
    problems = []
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
    import copy

    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise JobFileError(source, [(key or item, f"override {item!r} must look like field.path=value")])
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise JobFileError(source, [(key, f"cannot set a field inside {part!r}, which is not a mapping")])
        try:
            node[parts[-1]] = safeyaml.load_value(raw)
        except safeyaml.YAMLInputError as e:
            raise JobFileError(source, [(key, f"--set value {raw[:80]!r}: {e}")]) from None
    return data


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
