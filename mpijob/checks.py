"""What a job file needs to run on a cluster, beyond what it needs to be valid at all (which `hvdk8s.spec`
checks): paths the ranks write or read must be on a volume, caches must point where the non-root MPI user
can write, hvdk8s's own variables keep their values, and the pods fit the namespace's Pod Security level.

These depend on the cluster only, so a job file that runs locally (a relative checkpoint directory, a
dataset on this machine) stays valid; `render` refuses it for a cluster, naming the field.
"""
from __future__ import annotations

from typing import Optional

from hvdk8s.core import layout
from hvdk8s.core.errors import UserError
from hvdk8s.spec import JobFileError, JobSpec

from . import podsecurity, volumes
from .environment import FROM_IMAGE, hvdk8s_env
from .topology import plan

# Variables that name a directory a library writes into (caches, config, home, temporary files).
CACHE_ENV = ("HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "HF_HOME", "HF_HUB_CACHE",
             "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME",
             "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KERAS_HOME", "TFHUB_CACHE_DIR",
             "CUDA_CACHE_PATH", "MPLCONFIGDIR", "PIP_CACHE_DIR", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR",
             "NUMBA_CACHE_DIR")
# Writable for the MPI user in every pod: its home (the image's), /tmp (mode 1777) and /dev/shm (an emptyDir).
WRITABLE_DIRS = (layout.MPI_USER_HOME, "/tmp", layout.SHM_DIR)


class ClusterJobError(JobFileError):
    """A valid job file that cannot run on a cluster as written."""

    def __init__(self, name: str, problems: list[tuple[str, str]]):
        super().__init__(f"job {name!r}", problems)
        UserError.__init__(self, f"job {name!r} cannot run on a cluster as written", problems)


# The fields only `render` and `launch` read. A job file that sets any of them is meant for a cluster, and
# `validate` refuses it for what would keep it from running there; one that sets none is a local job, which
# `validate` passes, noting what a cluster would refuse. (`resources` is not among them: the examples set it
# for both, and a local launch ignores it.)
CLUSTER_FIELDS = ("kubernetes", "image")


def has_cluster_settings(spec: JobSpec) -> bool:
    return any(f in spec.model_fields_set for f in CLUSTER_FIELDS)


def raise_for(spec: JobSpec) -> None:
    problems = cluster_problems(spec)
    if problems:
        raise ClusterJobError(spec.name, problems)


def cluster_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """(field path, what is wrong) for everything that keeps SPEC from running on a cluster."""
    return (_image(spec) + _storage(spec) + _environment(spec) + _launcher(spec) + _elastic(spec)
            + _pod_security(spec))


def _image(spec: JobSpec) -> list[tuple[str, str]]:
    if not spec.image.strip() or any(c.isspace() for c in spec.image):
        return [("image", f"{spec.image!r} is not a container image reference (e.g. ghcr.io/org/image:tag)")]
    return []


def _where(path: str) -> str:
    return (f"{path!r} is relative (a rank would resolve it inside its pod) and so" if not path.startswith("/")
            else path)


def _storage(spec: JobSpec) -> list[tuple[str, str]]:
    out = []
    ckpt = spec.training.checkpoint.dir
    if ckpt is not None and volumes.covering(spec, ckpt, writable=True) is None:
        read_only = volumes.covering(spec, ckpt)
        out.append(("training.checkpoint.dir",
                    f"{_where(ckpt)} is on volume {read_only.name!r}, mounted read-only" if read_only else
                    f"{_where(ckpt)} is on no volume of kubernetes.volumes: checkpoints would be lost with the pod; "
                    "mount a PersistentVolumeClaim or NFS export (e.g. {name: ckpt, mount_path: /ckpt, pvc: "
                    "my-claim}) and put the directory under its mount_path"))
    out += _run_dir(spec)
    d = spec.dataset
    if d is not None and d.path is not None and not d.remote and volumes.covering(spec, d.path) is None:
        out.append(("dataset.path", f"{_where(d.path)} is on no volume of kubernetes.volumes, so no pod has it; "
                                    "mount the volume that holds it (an NFS export or a PersistentVolumeClaim)"))
    return out


def _run_dir(spec: JobSpec) -> list[tuple[str, str]]:
    """The timeline, autotune log and TensorBoard events outlive the pod only on a writable volume. A run
    directory taken from training.checkpoint.dir is checked as that field (above)."""
    o = spec.observability
    if not o.wanted or o.dir is None or volumes.covering(spec, o.dir, writable=True) is not None:
        return []
    read_only = volumes.covering(spec, o.dir)
    return [("observability.dir",
             f"{_where(o.dir)} is on volume {read_only.name!r}, mounted read-only" if read_only else
             f"{_where(o.dir)} is on no volume of kubernetes.volumes, and {', '.join(o.wanted)} would be lost with "
             "the pod; put it under a writable volume's mount_path (a PersistentVolumeClaim or NFS export)")]


def _writable(spec: JobSpec, path: str) -> bool:
    if not path.startswith("/"):
        return False
    path = volumes.normalized(path)
    if any(layout.inside(path, m) for m in layout.RESERVED_MOUNTS if m != layout.SHM_DIR):
        return False  # the job ConfigMap and SSH keys are read-only mounts
    if any(layout.inside(path, d) for d in WRITABLE_DIRS):
        return True
    return volumes.covering(spec, path, writable=True) is not None


def _environment(spec: JobSpec) -> list[tuple[str, str]]:
    k8s = spec.kubernetes
    out = []
    own = set(hvdk8s_env(spec, plan(spec.resources))) | set(FROM_IMAGE)
    for field, names in (("env", k8s.env), ("secret_env", k8s.secret_env)):
        for name in sorted(set(names) & own):
            out.append((f"kubernetes.{field}.{name}", f"{name} is set by hvdk8s (from the job file's own fields, "
                                                      "or the image); it cannot be overridden here"))
    for name in CACHE_ENV:
        value = k8s.env.get(name)
        if value is not None and not _writable(spec, value):
            out.append((f"kubernetes.env.{name}",
                        f"{value!r} is not writable by the ranks' non-root user: use a path under "
                        f"{', '.join(WRITABLE_DIRS)} or a writable volume's mount_path"
                        + (" (not the dataset cache, which holds only synced datasets)"
                           if layout.inside(volumes.normalized(value), k8s.cache_dir) else "")))
    return out


def _launcher(spec: JobSpec) -> list[tuple[str, str]]:
    k8s = spec.kubernetes
    if not k8s.run_launcher_as_worker:
        return []
    out = []
    workers = plan(spec.resources).workers
    if workers != 1:
        out.append(("kubernetes.run_launcher_as_worker", f"is for jobs of one worker pod; this one has {workers}"))
    if k8s.launcher.node_selector or k8s.launcher.tolerations:
        out.append(("kubernetes.launcher", "with run_launcher_as_worker the launcher is the worker: it is placed "
                                           "by kubernetes.node_selector and kubernetes.tolerations"))
    return out


def _elastic(spec: JobSpec) -> list[tuple[str, str]]:
    e = spec.training.elastic
    if e is None:
        return []
    out = []
    workers = plan(spec.resources).workers
    if not e.min_workers <= workers <= e.max_workers:
        field = "resources.gpus" if spec.resources.gpus else "resources.workers"
        out.append(("training.elastic", f"the job starts {workers} worker pod(s) ({field}), outside "
                                        f"min_workers..max_workers ({e.min_workers}..{e.max_workers})"))
    if spec.kubernetes.run_launcher_as_worker:
        out.append(("kubernetes.run_launcher_as_worker", "not with training.elastic: workers come and go, and "
                                                         "the launcher must outlive them"))
    return out


def _pod_security(spec: JobSpec) -> list[tuple[str, str]]:
    enforced: Optional[str] = spec.kubernetes.pod_security
    if enforced is None:
        return []
    return [(field, f"{why}: needs the {need} Pod Security level, and kubernetes.pod_security says the namespace "
                    f"enforces {enforced}")
            for need, field, why in podsecurity.rejected_by(spec, enforced)]
