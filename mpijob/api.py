"""The Kubeflow MPIJob API that hvdk8s makes and checks: mpi-operator v0.8's kubeflow.org/v2beta1. The one
place its identity is written (the renderer, the validator, the operator's picture and the cluster client
read it here)."""
from __future__ import annotations

GROUP = "kubeflow.org"
VERSION = "v2beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MPIJob"
PLURAL = "mpijobs"
CRD_NAME = f"{PLURAL}.{GROUP}"

# The keys of spec.mpiReplicaSpecs the operator reads (MPIReplicaType); it ignores any other.
LAUNCHER = "Launcher"
WORKER = "Worker"
REPLICA_TYPES = (LAUNCHER, WORKER)

# The values v2beta1's enumerated fields take (the constants of its types.go), in the order hvdk8s's
# messages list them.
RESTART_POLICIES = ("Never", "OnFailure")
CLEAN_POD_POLICIES = ("None", "Running", "All")
MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")  # the CRD's enum, in its order
LAUNCHER_CREATION_POLICIES = ("AtStartup", "WaitForWorkersReady")
MANAGERS = ("kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue")  # runPolicy.managedBy
