"""The job file's root, `JobSpec`: its name, framework and image beside its sections (what runs, where it
runs, what it reports), and the job as a back end hands it to its ranks (`with_backend_defaults`)."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from hvdk8s._version import __version__
from hvdk8s.core.strict import StrictModel
from hvdk8s.spec.kubernetes import KubernetesSpec
from hvdk8s.spec.observability import ObservabilitySpec
from hvdk8s.spec.resources import ResourcesSpec
from hvdk8s.spec.workload import DatasetSpec, EntrypointSpec, ModelSpec, TrainingSpec

Framework = Literal["pytorch", "tensorflow"]

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


IMAGE_REPOSITORY = "ghcr.io/hvdk8s/hvdk8s"
# How each default image is built (Dockerfile.gpu's DEVICE argument picks CUDA or plain Ubuntu).
IMAGE_BUILDS = {"gpu": "docker build -f Dockerfile.gpu -t {image} .",
                "cpu": "docker build -f Dockerfile.gpu --build-arg DEVICE=cpu -t {image} ."}


def default_image(resources: ResourcesSpec) -> str:
    """hvdk8s's image for a job without `image:`: a CPU job gets the CPU build, not gigabytes of CUDA."""
    device = "gpu" if resources.gpus else "cpu"
    return f"{IMAGE_REPOSITORY}-{device}:{__version__}"


class JobSpec(StrictModel):
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


def with_backend_defaults(spec: JobSpec, cluster: bool) -> JobSpec:
    """The job as a back end hands it to its ranks: what the job file leaves to the back end decided
    (metrics: on in cluster runs, off in local ones)."""
    m = spec.observability.metrics
    if m.enabled is not None:
        return spec
    metrics = m.model_copy(update={"enabled": cluster})
    return spec.model_copy(update={"observability": spec.observability.model_copy(update={"metrics": metrics})})
