"""hvdk8s's own policies: what it refuses although the API server and the operator accept it, each problem
marked `Problem.policy` (left out with `policies=False`, `hvdk8s validate --no-policy`)."""
from __future__ import annotations

from typing import Any

from ..api import LAUNCHER_CREATION_POLICIES, REPLICA_TYPES
from ..problems import POLICY, Problem, child, unsupported
from .podrules import CONTAINER_LISTS


def spec_policy_problems(spec: dict, path: str) -> list[Problem]:
    """Values the operator would silently ignore or reinterpret, in SPEC (an MPIJob's spec at PATH)."""
    problems = []
    policy = spec.get("launcherCreationPolicy")
    if policy is not None and policy not in LAUNCHER_CREATION_POLICIES:
        problems.append(Problem(child(path, "launcherCreationPolicy"),
                                POLICY + unsupported(policy, LAUNCHER_CREATION_POLICIES)
                                + " (the CRD and the operator accept any value and treat it as WaitForWorkersReady)",
                                policy=True))
    replica_specs = spec.get("mpiReplicaSpecs")
    for rtype in replica_specs if isinstance(replica_specs, dict) else ():
        if rtype not in REPLICA_TYPES:
            problems.append(Problem(child(child(path, "mpiReplicaSpecs"), rtype),
                                    POLICY + unsupported(rtype, REPLICA_TYPES)
                                    + " (the operator ignores other replica types)", policy=True))
    return problems


def privileged_containers(template: dict, path: str) -> list[Problem]:
    """Privileged containers in TEMPLATE (a pod template at PATH): hvdk8s renders none."""
    spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    problems = []
    for field in CONTAINER_LISTS:
        for i, container in enumerate(spec.get(field) if isinstance(spec.get(field), list) else []):
            security: Any = container.get("securityContext") if isinstance(container, dict) else None
            if isinstance(security, dict) and security.get("privileged") is True:
                problems.append(Problem(child(child(child(path, "spec"), field), i) + ".securityContext.privileged",
                                        POLICY + "privileged containers are refused (the API server and the "
                                        "operator accept them; hvdk8s renders none)", policy=True))
    return problems
