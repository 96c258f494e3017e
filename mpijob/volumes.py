"""The job file's own volumes (`kubernetes.volumes`) as pod volumes and mounts, and which of them holds a
path: checkpoints and local datasets must be on one, or they would be written into a pod's own file
system (gone with the pod) or read from a path that no pod has."""
from __future__ import annotations

import posixpath
from typing import Any, Optional

from hvdk8s.core import layout


def pod_volume(volume) -> dict[str, Any]:
    if volume.pvc is not None:
        source: dict[str, Any] = {"persistentVolumeClaim": {"claimName": volume.pvc}}
    elif volume.nfs is not None:
        source = {"nfs": {"server": volume.nfs.server, "path": volume.nfs.path}}
    else:
        # An existing directory (type Directory): a typo fails the pod instead of creating a new empty one.
        source = {"hostPath": {"path": volume.host_path, "type": "Directory"}}
    if volume.read_only and "persistentVolumeClaim" in source:
        source["persistentVolumeClaim"]["readOnly"] = True
    if volume.read_only and "nfs" in source:
        source["nfs"]["readOnly"] = True
    return {"name": volume.name, **source}


def mount(volume, read_only: Optional[bool] = None) -> dict[str, Any]:
    ro = volume.read_only if read_only is None else read_only
    return {"name": volume.name, "mountPath": volume.mount_path, **({"readOnly": True} if ro else {})}


def pod_volumes(spec, launcher: bool = False) -> list[dict[str, Any]]:
    """The rank pods' volumes: all of the job's; the launcher's (LAUNCHER): those marked `launcher`."""
    return [pod_volume(v) for v in spec.kubernetes.volumes if v.launcher or not launcher]


def mounts(spec, launcher: bool = False) -> list[dict[str, Any]]:
    return [mount(v) for v in spec.kubernetes.volumes if v.launcher or not launcher]


def normalized(path: str) -> str:
    return posixpath.normpath(path.removeprefix("file://"))


def covering(spec, path: str, writable: bool = False):
    """The job volume (deepest mount first) that holds absolute PATH, and is writable if asked; else None."""
    path = normalized(path)
    candidates = [v for v in spec.kubernetes.volumes if layout.inside(path, v.mount_path)]
    candidates.sort(key=lambda v: len(v.mount_path), reverse=True)  # the deepest mount is what the ranks see
    if not candidates or (writable and candidates[0].read_only):
        return None
    return candidates[0]
