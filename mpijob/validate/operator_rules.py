"""The rules mpi-operator v0.8.2 enforces on an MPIJob (pkg/apis/kubeflow/validation/validation.go), one
function per sub-object as there, each given the field path of what it checks.

The operator applies them after its defaults (SetDefaults_MPIJob), so a field it defaults is checked only
where it is set: slotsPerWorker 1, runPolicy.cleanPodPolicy None, sshAuthMountPath /root/.ssh (also for
""), mpiImplementation OpenMPI (also for ""), a Launcher's replicas 1 and restartPolicy OnFailure, a
Worker's replicas 0 (below its minimum) and restartPolicy Never. Values of the wrong type are left to the
schema, which reports them."""
from __future__ import annotations

from typing import Any, Iterable

from hvdk8s.core import k8snames

from ..api import CLEAN_POD_POLICIES, LAUNCHER, MANAGERS, MPI_IMPLEMENTATIONS, RESTART_POLICIES, WORKER
from ..problems import Problem, child, unsupported
from .schema import is_int

_GENERATED_SUFFIX = "xxxxx"  # the API server appends 5 random lower-case alphanumerics to generateName
_GENERATE_NAME_MAX = 58  # ...after cutting the prefix to 63 - 5 characters


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def operator_problems(job: dict) -> list[Problem]:
    """ValidateMPIJob: every rule the operator checks before it makes a job's pods."""
    spec = _d(job.get("spec"))  # no spec: the operator sees every default, and no replica specs
    return (validate_mpijob_name(_d(job.get("metadata")), _d(spec.get("mpiReplicaSpecs")))
            + validate_mpijob_spec(spec, "spec"))


def validate_mpijob_name(meta: dict, replica_specs: dict) -> list[Problem]:
    """Workers are Pods with hostnames `<name>-worker-<i>`, which must be DNS-1035 labels."""
    name, field = meta.get("name"), "metadata.name"
    if not isinstance(name, str) or not name:  # the server names the job from generateName first
        name, field = meta.get("generateName"), "metadata.generateName"
        if not isinstance(name, str) or not name:
            return []
        name = name[:_GENERATE_NAME_MAX] + _GENERATED_SUFFIX
    workers = _d(replica_specs.get(WORKER))
    count = workers["replicas"] if is_int(workers.get("replicas")) and workers["replicas"] > 0 else 1
    hostname = f"{name}-worker-{count - 1}"
    if k8snames.dns1035_label(hostname):
        return [Problem(field, f"worker hostname {hostname!r} is not a DNS-1035 label (at most 63 characters, "
                               "a-z, 0-9 and '-', starting with a letter)")]
    return []


def validate_mpijob_spec(spec: dict, path: str) -> list[Problem]:
    problems = validate_mpi_replica_specs(spec.get("mpiReplicaSpecs"), child(path, "mpiReplicaSpecs"))
    problems += _nonnegative(spec, "slotsPerWorker", path)
    problems += validate_run_policy(_d(spec.get("runPolicy")), child(path, "runPolicy"))
    # sshAuthMountPath must be set: the defaults always set it.
    if isinstance(spec.get("mpiImplementation"), str) and spec["mpiImplementation"]:
        problems += _choice(spec, "mpiImplementation", MPI_IMPLEMENTATIONS, path)
    return problems


def validate_run_policy(policy: dict, path: str) -> list[Problem]:
    problems = _choice(policy, "cleanPodPolicy", CLEAN_POD_POLICIES, path)
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        problems += _nonnegative(policy, key, path)
    problems += _choice(policy, "managedBy", MANAGERS, path)
    return problems


def validate_mpi_replica_specs(replica_specs: Any, path: str) -> list[Problem]:
    if replica_specs is None:
        return [Problem(path, "required field is missing")]
    if not isinstance(replica_specs, dict):
        return []  # mistyped: the schema says so
    return (validate_launcher_replica_spec(replica_specs.get(LAUNCHER), child(path, LAUNCHER))
            + validate_worker_replica_spec(replica_specs.get(WORKER), child(path, WORKER)))


def validate_launcher_replica_spec(spec: Any, path: str) -> list[Problem]:
    if spec is None:
        return [Problem(path, "required field is missing (an MPIJob needs a launcher)")]
    if not isinstance(spec, dict):
        return []
    problems = validate_replica_spec(spec, path)
    if is_int(spec.get("replicas")) and spec["replicas"] != 1:
        problems.append(Problem(child(path, "replicas"), "must be 1 (one launcher)"))
    return problems


def validate_worker_replica_spec(spec: Any, path: str) -> list[Problem]:
    if not isinstance(spec, dict):
        return []  # none: a launcher alone (e.g. runLauncherAsWorker) is allowed
    problems = validate_replica_spec(spec, path)
    replicas = spec.get("replicas")
    if replicas is None:
        problems.append(Problem(child(path, "replicas"), "required field is missing (the operator's default "
                                                         "for a Worker, 0, is below its minimum of 1)"))
    elif is_int(replicas) and replicas < 1:
        problems.append(Problem(child(path, "replicas"), "must be >= 1"))
    return problems


def validate_replica_spec(spec: dict, path: str) -> list[Problem]:
    """What a Launcher and a Worker spec share (replicas are defaulted per type, so checked there)."""
    problems = _choice(spec, "restartPolicy", RESTART_POLICIES, path) if spec.get("restartPolicy") else []
    if not _d(_d(spec.get("template")).get("spec")).get("containers"):
        problems.append(Problem(child(path, "template.spec.containers"), "must define at least one container"))
    return problems


def _choice(obj: dict, key: str, allowed: Iterable[str], path: str) -> list[Problem]:
    if obj.get(key) is not None and obj[key] not in allowed:
        return [Problem(child(path, key), unsupported(obj[key], allowed))]
    return []


def _nonnegative(obj: dict, key: str, path: str) -> list[Problem]:
    if is_int(obj.get(key)) and obj[key] < 0:
        return [Problem(child(path, key), "must be >= 0")]
    return []
