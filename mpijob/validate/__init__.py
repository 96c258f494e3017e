"""Client-side validation of Kubeflow MPIJobs (kubeflow.org/v2beta1).

The aim is to judge as the cluster does: accept what the API server and mpi-operator v0.8.2 accept, reject
what they reject, each with a field path. Layers, each reporting every problem as a `Problem(path, message)`:

* the fields (`schema`): an OpenAPI v3 structural schema, applied as the API server applies a CRD's:
  either the `openAPIV3Schema` of the MPIJob CRD a cluster serves (`crd`: of a file, or read through the
  Kubernetes client) or hvdk8s's own compact description of the v2beta1 fields (`builtin`);
* the object's metadata as the API server checks every object's (`objectmeta`);
* the rules mpi-operator enforces (`operator_rules`, after its defaults, one function per sub-object as in
  its pkg/apis/kubeflow/validation);
* the pod templates, as the Pods the operator makes of them (`pod`): against the Kubernetes JSON schemas
  that kubernetes-validate bundles, and the API server's Pod rules no schema encodes (`podrules`);
* hvdk8s's own policies (`policies`), marked `Problem.policy` and left out with `policies=False`: no
  privileged containers, no replica types or launcherCreationPolicy values the operator would ignore.

`job` puts them together: `validate_mpijob` (one object) and `validate_documents` (a YAML stream).
"""
from __future__ import annotations

from ..api import CLEAN_POD_POLICIES, LAUNCHER_CREATION_POLICIES, MANAGERS, REPLICA_TYPES, RESTART_POLICIES
from ..problems import POLICY, Problem
from .builtin import BUILTIN_SCHEMA, QUANTITY_PATTERN
from .crd import MAX_YAML_BYTES, load_crd_schema, served_crd_schema
from .job import validate_documents, validate_mpijob
from .operator_rules import (operator_problems, validate_mpi_replica_specs, validate_mpijob_spec,
                             validate_run_policy)
from .pod import K8S_VERSION, pod_schema_available, validate_pod_template
from .schema import prune_nulls, validate_schema

__all__ = [
    "BUILTIN_SCHEMA", "CLEAN_POD_POLICIES", "K8S_VERSION", "LAUNCHER_CREATION_POLICIES", "MANAGERS", "MAX_YAML_BYTES",
    "POLICY", "Problem", "QUANTITY_PATTERN", "REPLICA_TYPES", "RESTART_POLICIES", "load_crd_schema",
    "operator_problems", "pod_schema_available", "prune_nulls", "served_crd_schema", "validate_documents",
    "validate_mpi_replica_specs", "validate_mpijob", "validate_mpijob_spec", "validate_pod_template",
    "validate_run_policy", "validate_schema",
]
