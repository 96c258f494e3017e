"""What a job runs, wherever it runs: `model`, `dataset` (and its S3 store), `training` (checkpoints, elastic
bounds), or `entrypoint`, the user's own script in place of hvdk8s's trainer."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, Field, field_validator, model_validator

from hvdk8s import compression, precision, schedule
from hvdk8s.core import suggest
from hvdk8s.core.strict import StrictModel
from hvdk8s.data import catalog
from hvdk8s.models import registry
from hvdk8s.spec.values import CONFIGMAP_KEY, INT32_MAX, DataKey, ObjectName


def _known_name(v: Optional[str], choices, kind: str, plural: str, otherwise: str) -> Optional[str]:
    """A model's or dataset's name if it is one of `choices`, else the nearest ones and the alternative."""
    if v is not None and v not in choices:
        raise ValueError(f"unknown {kind} {v!r}; {suggest.hint(v, choices, plural)} (or give {otherwise})")
    return v


Precision = Literal[precision.CHOICES]
Compression = Literal[compression.CHOICES]

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
Task = Literal["classification", "language_model"]


def _import_path(v: Optional[str]) -> Optional[str]:
    if v is not None and not _IMPORT_PATH.match(v):
        raise ValueError(f"{v!r} is not an import path; write 'package.module:function'")
    return v


ImportPath = Annotated[Optional[str], AfterValidator(_import_path)]


class ModelSpec(StrictModel):
    name: Optional[str] = Field(default=None, description="registry name: mlp, cnn, resnet or transformer")
    factory: ImportPath = Field(default=None, description="your own model: 'package.module:function' that "
                                                          "returns a torch.nn.Module or a keras.Model")
    task: Optional[Task] = Field(default=None, description="what a factory model does (default classification): "
                                                           "picks the loss and accuracy")
    args: dict[str, Any] = Field(default_factory=dict, description="the model's own arguments")

    @field_validator("name")
    @classmethod
    def _known(cls, v: Optional[str]) -> Optional[str]:
        return _known_name(v, sorted(registry.REGISTRY), "model", "registered models", "`factory` for your own")

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


class CABundleSpec(StrictModel):
    """A PEM file of the certificate authorities to trust, from a Secret or a ConfigMap of the job's namespace."""

    secret: Optional[ObjectName] = None
    config_map: Optional[ObjectName] = None
    key: DataKey = Field(default="ca.crt", description="the key holding the PEM text")

    @model_validator(mode="after")
    def _one_source(self) -> "CABundleSpec":
        if (self.secret is None) == (self.config_map is None):
            raise ValueError("give exactly one of `secret` or `config_map` (the object holding the PEM file)")
        return self


class S3Spec(StrictModel):
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


class DatasetSpec(StrictModel):
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
        return _known_name(v, catalog.BUILTIN, "dataset", "built-in datasets",
                           "`path` to a dataset in the shard format")

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


class CheckpointSpec(StrictModel):
    dir: Optional[str] = Field(default=None, description="where rank 0 writes checkpoints; none: no checkpoints")
    interval_epochs: int = Field(default=1, gt=0, le=1_000_000)
    keep: int = Field(default=3, ge=1, description="newest checkpoints kept")


class PowerSGDSpec(StrictModel):
    """PowerSGD's settings (training.compression: powersgd; hvdk8s/_torch_powersgd.py, hvdk8s/_tf_powersgd.py)."""

    rank: int = Field(default=4, ge=1, le=1024, description="columns of the low-rank factors: the bytes sent per "
                                                            "weight matrix are (rows + columns) x rank")
    start_step: int = Field(default=10, ge=0, le=1_000_000_000,
                            description="optimizer steps that average whole gradients before compression starts")
    min_compression_rate: float = Field(default=2.0, ge=0.0, le=1e6, allow_inf_nan=False,
                                        description="compress a matrix only where its factors are this many "
                                                    "times smaller; others are averaged whole")


class ElasticSpec(StrictModel):
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


class TrainingSpec(StrictModel):
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
        default="auto", description="gradient compression: auto picks fp16 where gradients cross a "
                                    "network between nodes; powersgd sends low-rank factors with "
                                    "error feedback")
    powersgd: Optional[PowerSGDSpec] = Field(default=None, description="PowerSGD's settings, with compression: "
                                                                       "powersgd (default: rank 4)")
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
                               "(ZeRO stage 1); 2: the gradients too (stage 2)")

    @field_validator("shard_optimizer_state", mode="before")
    @classmethod
    def _stage_not_boolean(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML's true would pass as 1
            raise ValueError(f"a stage, 0, 1 or 2, not {str(v).lower()}")
        return v


class EntrypointSpec(StrictModel):
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
        if self.carried and (not CONFIGMAP_KEY.match(self.script_name) or self.script_name == "job.yaml"):
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
