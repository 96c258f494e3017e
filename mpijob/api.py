"""The Kubeflow MPIJob API that hvdk8s makes and checks: mpi-operator v0.8's kubeflow.org/v2beta1. The one
place its identity is written (the renderer, the validator and the cluster client read it here)."""
from __future__ import annotations

GROUP = "kubeflow.org"
VERSION = "v2beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MPIJob"
PLURAL = "mpijobs"
CRD_NAME = f"{PLURAL}.{GROUP}"
