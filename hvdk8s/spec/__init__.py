"""The job file: one YAML document that describes a training job, validated into a `JobSpec`.

The same JobSpec feeds `hvdk8s train` (each rank), `hvdk8s launch --local` and the cluster side.
Every problem is reported with the field path it concerns (`training.batch_size`) and what is
allowed there; `JobFileError` carries all of them at once.

The sections, each in its own module: `workload` (model, dataset, training, entrypoint: what runs),
`resources` and `kubernetes` (what a cluster gives the job and the rules it admits it by),
`observability` (metrics, timeline, TensorBoard), `job` (the root, JobSpec); `values` holds the value
rules they share. `problems` turns pydantic's errors into field paths; `loading` reads, validates and
writes job files. Importers use `hvdk8s.spec` alone: every name is re-exported here.
"""
from hvdk8s.spec.job import IMAGE_BUILDS, IMAGE_REPOSITORY, Framework, JobSpec, default_image, with_backend_defaults
from hvdk8s.spec.kubernetes import (KubernetesSpec, LauncherSpec, NFSVolumeSpec, PodSecurityLevel,
                                    SchedulingPolicySpec, SecretRef, TolerationSpec, VolumeSpec)
from hvdk8s.spec.loading import JOB_ENV, apply_overrides, current_job, dump_job, load_job, parse_job, read_job_file
from hvdk8s.spec.observability import AUTOTUNE_FILE, TENSORBOARD_DIR, TIMELINE_FILE, MetricsSpec, ObservabilitySpec
from hvdk8s.spec.problems import JobFileError
from hvdk8s.spec.resources import PER_WORKER_POD, SHM_DEFAULT_MAX, RDMASpec, ResourcesSpec, Tuning
from hvdk8s.spec.values import INT32_MAX, DataKey, ObjectName
from hvdk8s.spec.workload import (REMOTE_SCHEMES, S3_SECRET_KEYS, S3_SECRET_OPTIONAL_KEYS, TRAINER_REQUIRED,
                                  CABundleSpec, CheckpointSpec, Compression, DatasetSpec, ElasticSpec,
                                  EntrypointSpec, ImportPath, ModelSpec, Precision, S3Spec, Task, TrainingSpec)

__all__ = [
    "AUTOTUNE_FILE", "CABundleSpec", "CheckpointSpec", "Compression", "DataKey", "DatasetSpec", "ElasticSpec",
    "EntrypointSpec", "Framework", "IMAGE_BUILDS", "IMAGE_REPOSITORY", "INT32_MAX", "ImportPath", "JOB_ENV",
    "JobFileError", "JobSpec", "KubernetesSpec", "LauncherSpec", "MetricsSpec", "ModelSpec", "NFSVolumeSpec",
    "ObjectName", "ObservabilitySpec", "PER_WORKER_POD", "PodSecurityLevel", "Precision", "RDMASpec",
    "REMOTE_SCHEMES", "ResourcesSpec", "S3Spec", "S3_SECRET_KEYS", "S3_SECRET_OPTIONAL_KEYS", "SHM_DEFAULT_MAX",
    "SchedulingPolicySpec", "SecretRef", "TENSORBOARD_DIR", "TIMELINE_FILE", "TRAINER_REQUIRED", "Task",
    "TolerationSpec", "TrainingSpec", "Tuning", "VolumeSpec", "apply_overrides", "current_job", "default_image",
    "dump_job", "load_job", "parse_job", "read_job_file", "with_backend_defaults",
]
