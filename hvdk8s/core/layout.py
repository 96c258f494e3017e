"""Where things are in a job's pods: the names and paths hvdk8s's renderer, the image (Dockerfile.gpu) and
mpi-operator v0.8.2 (pkg/controller/mpi_job_controller.go) each use, in one place so that a job file's
own volumes can be checked against them. Imports nothing of hvdk8s: the job-file models read it too."""
from __future__ import annotations

# The image: the MPI user, its home (sshd's config, the launcher's working directory) and the venv.
MPI_UID = 1000
MPI_USER_HOME = "/home/mpiuser"
VENV = "/opt/hvdk8s"
SSH_AUTH_MOUNT = f"{MPI_USER_HOME}/.ssh"  # the MPIJob's sshAuthMountPath

# hvdk8s's volumes.
SHM_VOLUME, SHM_DIR = "dshm", "/dev/shm"
JOB_VOLUME, JOB_DIR = "job", "/etc/hvdk8s"
CACHE_VOLUME = "dataset-cache"  # mounted at kubernetes.cache_dir
S3_CA_VOLUME = "s3-ca-bundle"  # dataset.s3.ca_bundle, in the dataset-cache sync container

# What the operator adds to the pods it creates from the templates: the SSH key Secret on every pod's
# first container, the hostfile ConfigMap on the launcher's.
OPERATOR_SSH_VOLUME = "ssh-auth"
OPERATOR_CONFIG_VOLUME, OPERATOR_CONFIG_DIR = "mpi-job-config", "/etc/mpi"
HOSTFILE = f"{OPERATOR_CONFIG_DIR}/hostfile"

RESERVED_VOLUMES = (SHM_VOLUME, JOB_VOLUME, CACHE_VOLUME, S3_CA_VOLUME, OPERATOR_SSH_VOLUME, OPERATOR_CONFIG_VOLUME)
RESERVED_MOUNTS = (SHM_DIR, JOB_DIR, OPERATOR_CONFIG_DIR, SSH_AUTH_MOUNT)
IMAGE_DIRS = (MPI_USER_HOME, VENV)  # a volume over these (or above them) would hide the image's files
SYSTEM_DIRS = ("/proc", "/sys", "/dev")


def overlaps(a: str, b: str) -> bool:
    """Whether one of two absolute, normalized paths is the other or lies inside it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def inside(path: str, directory: str) -> bool:
    """Whether PATH is DIRECTORY or lies inside it (both absolute and normalized)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")
