"""The security contexts of every pod and container hvdk8s renders, in one place.

Each pod runs as the image's non-root MPI user under the container runtime's default seccomp profile;
each container drops every capability and cannot gain privileges. That is the Pod Security Standards'
restricted level; what a job adds beyond it (a hostPath, an NFS volume, a root init container) is listed
by `podsecurity.requirements`.
"""
from __future__ import annotations

from typing import Any


def pod(kubernetes) -> dict[str, Any]:
    uid = kubernetes.run_as_user
    # fsGroup: a fresh PersistentVolume's root is root:root 0755, where a checkpoint written as uid 1000 fails
    # with PermissionError. The kubelet hands volumes that support ownership management to this group
    # (group-writable); OnRootMismatch skips the recursive walk when the root already matches, so a large
    # volume does not delay every start. NFS and hostPath are left as they are: see docs/cluster-operators.md.
    return {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True, "fsGroup": uid,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


def container() -> dict[str, Any]:
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def root_with(*capabilities: str) -> dict[str, Any]:
    """A container that must run as root, with only CAPABILITIES (still never privileged)."""
    return {"privileged": False, "allowPrivilegeEscalation": False, "runAsUser": 0, "runAsNonRoot": False,
            "capabilities": {"drop": ["ALL"], "add": list(capabilities)}}
