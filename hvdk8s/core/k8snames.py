"""Kubernetes name and label syntax, checked in one place for the job file and for MPIJob validation.

Each function returns what is wrong with a value (an empty list when it is valid), in the spirit of
k8s.io/apimachinery's `validation.IsDNS1123Label` and friends, so callers can attach a field path.
"""
from __future__ import annotations

import re

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_PORT_NAME = re.compile(r"[-a-z0-9]+")
_INTERFACE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,14}")  # IFNAMSIZ 16 with the NUL; no '/' or ':'


def dns1123_label(value: str) -> list[str]:
    """Names of namespaces, containers, volumes: at most 63 of a-z, 0-9, '-', alphanumeric at both ends."""
    if len(value) > 63:
        return [f"{value[:20]!r}... is longer than 63 characters"]
    if not _DNS1123_LABEL.fullmatch(value):
        return [f"{value!r} is not a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a "
                "letter or digit"]
    return []


def dns1123_subdomain(value: str) -> list[str]:
    """Names of most objects (Secrets, ServiceAccounts, PriorityClasses): DNS-1123 labels joined by '.'."""
    if len(value) > 253:
        return [f"{value[:20]!r}... is longer than 253 characters"]
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return [f"{value!r} is not a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', starting and "
                "ending with a letter or digit"]
    return []


def dns1035_label(value: str) -> list[str]:
    """Pod hostnames and Service names: a DNS-1123 label that starts with a letter."""
    if len(value) > 63:
        return [f"{value[:20]!r}... is longer than 63 characters"]
    if not _DNS1035_LABEL.fullmatch(value):
        return [f"{value!r} is not a DNS-1035 label: lower-case letters, digits and '-', starting with a letter "
                "and ending with a letter or digit"]
    return []


def qualified_name(value: str) -> list[str]:
    """Label and annotation keys: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63 characters."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return [f"{value!r}: the prefix before '/' must not be empty"]
    problems = [f"{value!r}: prefix {p}" for p in dns1123_subdomain(prefix)] if slash else []
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        problems.append(f"{value!r}: the name part must be 1-63 letters, digits, '-', '_' or '.', starting and "
                        "ending with a letter or digit")
    return problems


def label_value(value: str) -> list[str]:
    """Label values (and nodeSelector values): empty, or at most 63 of letters, digits, '-', '_', '.'."""
    if len(value) > 63:
        return [f"{value[:20]!r}... is longer than 63 characters"]
    if value and not _QUALIFIED_NAME.fullmatch(value):
        return [f"{value!r} must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"]
    return []


def labels(mapping: dict) -> list[tuple[str, str]]:
    """(key, problem) for every invalid key or value of a label map."""
    out = []
    for key, value in mapping.items():
        out += [(str(key), p) for p in (qualified_name(key) if isinstance(key, str) else [f"{key!r} is not text"])]
        out += [(str(key), p) for p in (label_value(value) if isinstance(value, str) else [f"{value!r} is not text"])]
    return out


def port_name(value: str) -> list[str]:
    """An IANA service name, as container ports and probes use: at most 15 of a-z, 0-9, '-', with a letter."""
    if not 1 <= len(value) <= 15:
        return [f"{value!r} must be 1-15 characters"]
    if not _PORT_NAME.fullmatch(value) or not re.search("[a-z]", value):
        return [f"{value!r} must be lower-case letters, digits and '-', with at least one letter"]
    if value.startswith("-") or value.endswith("-") or "--" in value:
        return [f"{value!r} must not start or end with '-' or hold '--'"]
    return []


def interface_name(value: str) -> list[str]:
    """A Linux network interface name as NCCL and OpenMPI take it: at most 15 characters, no '/' or blanks."""
    if not _INTERFACE.fullmatch(value):
        return [f"{value!r} is not a network interface name (at most 15 letters, digits, '.', '_', '-', '@')"]
    return []


def multus_interfaces(annotation: str) -> list[str]:
    """The interfaces a pod gets from a Multus `k8s.v1.cni.cncf.io/networks` annotation, in order.

    The annotation is `[namespace/]name[@interface]` entries joined by commas, or a JSON list of
    {name, namespace, interface}; Multus names an entry without an interface `net<N>`, N its 1-based
    position. ValueError says what is wrong."""
    import json

    text = annotation.strip()
    if text.startswith("["):
        try:
            entries = json.loads(text)
        except ValueError as e:
            raise ValueError(f"the networks annotation is not a JSON list ({e})") from None
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                    for e in entries):
            raise ValueError("a JSON networks annotation is a list of objects, each with a `name`")
        refs = [(e.get("namespace") or "", e["name"], e.get("interface")) for e in entries]
    else:
        items = [item.strip() for item in text.split(",")]
        if not text or not all(items):
            raise ValueError(f"{annotation!r} is not a list of networks ([namespace/]name[@interface], comma-separated)")
        refs = []
        for item in items:
            ref, _, interface = item.partition("@")
            namespace, _, name = ref.rpartition("/")
            refs.append((namespace, name, interface or None))
    interfaces = []
    for position, (namespace, name, interface) in enumerate(refs, 1):
        problems = dns1123_subdomain(name) + (dns1123_label(namespace) if namespace else [])
        if interface is not None:
            problems += interface_name(interface) if isinstance(interface, str) else [f"{interface!r} is not text"]
        if problems:
            raise ValueError(f"network {position}: {'; '.join(problems)}")
        interfaces.append(interface or f"net{position}")
    return interfaces
