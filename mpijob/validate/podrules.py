"""The API server's rules for Pods that no schema encodes (k8s.io/kubernetes pkg/apis/core/validation:
ValidatePodSpec and what it calls), applied to an MPIJob's pod templates: the MPI operator creates Pods
from them, and a Pod the API server rejects leaves the job waiting with nothing but an Event to say why.

A template is checked as the operator will submit it: with the SSH key volume it adds to every pod (and
the hostfile volume it adds to the launcher) counted as present, and names or mount paths that collide
with those reported.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Mapping, Optional

from hvdk8s.core import k8snames, quantity

from ..problems import Problem, child, duplicates, unsupported
from .objectmeta import annotation_problems, label_problems

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
PROTOCOLS = ("TCP", "UDP", "SCTP")


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list:
    return value if isinstance(value, list) else []


def template_problems(template: dict, path: str, operator_volumes: Optional[Mapping[str, str]] = None) -> list[Problem]:
    """Every API-server rule TEMPLATE (a PodTemplateSpec at PATH) breaks. OPERATOR_VOLUMES: {volume name: the
    mount path on the first container} of what the operator adds to this pod."""
    operator_volumes = dict(operator_volumes or {})
    meta, spec = _d(template.get("metadata")), _d(template.get("spec"))
    meta_path, spec_path = child(path, "metadata"), child(path, "spec")
    out = label_problems(meta.get("labels"), child(meta_path, "labels"))
    out += annotation_problems(meta.get("annotations"), child(meta_path, "annotations"))
    out += label_problems(spec.get("nodeSelector"), child(spec_path, "nodeSelector"))
    for field in ("priorityClassName", "schedulerName", "serviceAccountName"):
        if isinstance(spec.get(field), str) and spec[field]:
            out += [Problem(child(spec_path, field), p) for p in k8snames.dns1123_subdomain(spec[field])]
    out += _tolerations(_l(spec.get("tolerations")), child(spec_path, "tolerations"))
    volume_names, volume_problems = _volumes(_l(spec.get("volumes")), child(spec_path, "volumes"), operator_volumes)
    out += volume_problems
    volume_names |= set(operator_volumes)
    out += _containers(spec, spec_path, volume_names, operator_volumes)
    return out


def _tolerations(tolerations: list, path: str) -> list[Problem]:
    out = []
    for i, t in enumerate(tolerations):
        t, where = _d(t), child(path, i)
        if t.get("key"):
            out += [Problem(child(where, "key"), p) for p in k8snames.qualified_name(str(t["key"]))]
        elif t.get("operator") != "Exists":
            out.append(Problem(child(where, "operator"), "must be Exists when `key` is empty"))
        if t.get("operator") == "Exists" and t.get("value"):
            out.append(Problem(child(where, "value"), "must be empty when `operator` is Exists"))
        if t.get("tolerationSeconds") is not None and t.get("effect") != "NoExecute":
            out.append(Problem(child(where, "effect"), "must be NoExecute when `tolerationSeconds` is set"))
    return out


def _volumes(volumes: list, path: str, operator_volumes: Mapping[str, str]) -> tuple[set, list[Problem]]:
    out = duplicates(volumes, ["name"], path)
    names = set()
    for i, volume in enumerate(volumes):
        name = _d(volume).get("name")
        if not isinstance(name, str):
            continue
        names.add(name)
        out += [Problem(child(child(path, i), "name"), p) for p in k8snames.dns1123_label(name)]
        if name in operator_volumes:
            out.append(Problem(child(child(path, i), "name"), f"the MPI operator adds a volume named {name!r} to "
                                                              "this pod; use another name"))
    return names, out


def _containers(spec: dict, spec_path: str, volume_names: set, operator_volumes: Mapping[str, str]) -> list[Problem]:
    out: list[Problem] = []
    first_seen: dict[str, str] = {}
    for field in CONTAINER_LISTS:
        items = _l(spec.get(field))
        list_path = child(spec_path, field)
        out += duplicates(items, ["name"], list_path)  # within a list: the same words as the schema's list-map check
        for i, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            where = child(list_path, i)
            name = container.get("name")
            if isinstance(name, str):
                out += [Problem(child(where, "name"), p) for p in k8snames.dns1123_label(name)]
                if name in first_seen and not first_seen[name].startswith(f"{list_path}["):
                    out.append(Problem(child(where, "name"), f"duplicate container name {name!r} (also "
                                                             f"{first_seen[name]}); names are unique across the pod"))
                first_seen.setdefault(name, where)
            if field != "ephemeralContainers" and not container.get("image"):
                # The Pod schema leaves image optional (for templates other tools fill in); Pod creation requires it.
                out.append(Problem(child(where, "image"), "required field is missing (Pods need an image)"))
            first = field == "containers" and i == 0
            out += _mounts(container, where, volume_names, operator_volumes if first else {})
            out += duplicates(_l(container.get("env")), ["name"], child(where, "env"))
            out += _ports(container, where)
            out += _probes(container, where)
            out += _resources(container.get("resources"), child(where, "resources"))
    return out


def _mounts(container: dict, where: str, volume_names: set, operator_mounts: Mapping[str, str]) -> list[Problem]:
    mounts = _l(container.get("volumeMounts"))
    path = child(where, "volumeMounts")
    out = duplicates(mounts, ["mountPath"], path)
    taken = {mount_path: name for name, mount_path in operator_mounts.items()}
    for i, mount in enumerate(mounts):
        mount = _d(mount)
        name, mount_path = mount.get("name"), mount.get("mountPath")
        if isinstance(name, str) and name not in volume_names:
            out.append(Problem(child(child(path, i), "name"), f"no volume named {name!r} in the pod's volumes"))
        if isinstance(mount_path, str) and mount_path in taken:
            out.append(Problem(child(child(path, i), "mountPath"), f"the MPI operator mounts its {taken[mount_path]!r} "
                                                                   f"volume at {mount_path} in this container"))
    return out


def _port_number(value: Any, where: str, allow_zero: bool = False) -> list[Problem]:
    if isinstance(value, bool) or not isinstance(value, int):
        return []  # a wrong type is the schema's to report
    if allow_zero and value == 0:
        return []
    if not 1 <= value <= 65535:
        return [Problem(where, f"{value} is not a port number (1-65535)")]
    return []


def _ports(container: dict, where: str) -> list[Problem]:
    ports = _l(container.get("ports"))
    path = child(where, "ports")
    out = duplicates(ports, ["containerPort", "protocol"], path)
    names: dict[str, int] = {}
    for i, port in enumerate(ports):
        port, at = _d(port), child(path, i)
        out += _port_number(port.get("containerPort"), child(at, "containerPort"))
        out += _port_number(port.get("hostPort"), child(at, "hostPort"), allow_zero=True)
        if isinstance(port.get("protocol"), str) and port["protocol"] not in PROTOCOLS:
            out.append(Problem(child(at, "protocol"), unsupported(port["protocol"], PROTOCOLS)))
        name = port.get("name")
        if isinstance(name, str):
            out += [Problem(child(at, "name"), p) for p in k8snames.port_name(name)]
            if name in names:
                out.append(Problem(child(at, "name"), f"duplicate port name {name!r} (also ports[{names[name]}])"))
            names.setdefault(name, i)
    return out


def _probes(container: dict, where: str) -> list[Problem]:
    out = []
    for probe_field in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = _d(container.get(probe_field))
        for handler in ("tcpSocket", "httpGet", "grpc"):
            if handler not in probe:
                continue
            port = _d(probe[handler]).get("port")
            at = child(child(child(where, probe_field), handler), "port")
            if isinstance(port, str) and handler != "grpc":
                out += [Problem(at, p) for p in k8snames.port_name(port)]
            else:
                out += _port_number(port, at)
    return out


def _resource_name(name: str) -> list[str]:
    if "/" in name:
        return [f"{name!r}: {p}" for p in k8snames.qualified_name(name)]
    if name in STANDARD_RESOURCES or name.startswith("hugepages-"):
        return []
    return [f"{name!r} is not a container resource (cpu, memory, ephemeral-storage, hugepages-<size>, or an "
            "extended resource domain/name)"]


def _native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name  # helper.IsNativeResource


def _overcommittable(name: str) -> bool:
    """cpu, memory and other native resources may be requested below their limit; GPUs and other extended
    resources (and huge pages) may not (helper.IsOvercommitAllowed)."""
    return _native(name) and not name.startswith("hugepages-")


def _resources(resources: Any, path: str) -> list[Problem]:
    resources = _d(resources)
    values: dict[str, dict[str, Decimal]] = {"limits": {}, "requests": {}}
    out = []
    for kind in ("limits", "requests"):
        for name, amount in _d(resources.get(kind)).items():
            at = child(child(path, kind), name)
            out += [Problem(at, p) for p in _resource_name(str(name))]
            if isinstance(amount, bool) or not isinstance(amount, (str, int, float)):
                continue  # the schema reports the type
            try:
                value = quantity.parse_quantity(amount)
            except ValueError as e:
                out.append(Problem(at, str(e)))
                continue
            if value < 0:
                out.append(Problem(at, "must be greater than or equal to 0"))
            elif not _native(str(name)) and value != value.to_integral_value():
                out.append(Problem(at, f"{amount} is not a whole number ({name} is counted in units)"))
            values[kind][str(name)] = value
    for name, request in values["requests"].items():
        at = child(child(path, "requests"), name)
        limit = values["limits"].get(name)
        if limit is None:
            if not _overcommittable(name):
                out.append(Problem(child(child(path, "limits"), name),
                                   f"required: {name} is requested, and requests of it must equal a limit"))
        elif not _overcommittable(name) and request != limit:
            out.append(Problem(at, f"must equal the {name} limit ({resources['limits'][name]}): it cannot be "
                                   "overcommitted"))
        elif request > limit:
            out.append(Problem(at, f"must be at most the {name} limit ({resources['limits'][name]})"))
    return out
