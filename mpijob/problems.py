"""What MPIJob validation reports: a `Problem` at a field path, and helpers shared by the schema checks and
the Pod rules, so that the same fault found by both reads the same (and is reported once)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence


@dataclass(frozen=True, order=True)
class Problem:
    path: str  # dotted, list indices in brackets; "" is the whole object
    message: str
    # True for what hvdk8s refuses by its own policy although the API server and the operator accept it
    # (`validate_mpijob(..., policies=False)` leaves those out).
    policy: bool = False

    def __str__(self) -> str:
        return f"{self.path or '(top level)'}: {self.message}"


POLICY = "hvdk8s policy: "  # the start of every policy problem's message


def json_type(value: Any) -> str:
    """VALUE's JSON type, as the API server names it in its messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int subclass in Python
        return "boolean"
    for kind, name in ((int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def unsupported(value: Any, allowed: Iterable[Any]) -> str:
    return f"unsupported value {value!r}; supported: {', '.join(map(str, allowed))}"


def child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


# Keys of list items Kubernetes fills in when absent, as the MPIJob CRD declares them (ports default to TCP).
KEY_DEFAULTS = {"protocol": "TCP"}


def duplicates(items: Sequence[Any], keys: Sequence[str], path: str,
               defaults: dict[str, Any] | None = None) -> list[Problem]:
    """Items of a list that repeat another's KEYS (x-kubernetes-list-type: map, as the API server enforces).
    Items that are not objects or lack a key without default are skipped: other checks report those."""
    defaults = {**KEY_DEFAULTS, **(defaults or {})}
    seen: set = set()
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        values = tuple(item.get(k, defaults.get(k)) for k in keys)
        if any(v is None for v in values):
            continue
        marker = json.dumps(values, sort_keys=True, default=str)
        if marker in seen:
            if len(keys) == 1:
                out.append(Problem(child(child(path, i), keys[0]), f"duplicate value {values[0]!r} (must be unique)"))
            else:
                what = ", ".join(f"{k} {v!r}" for k, v in zip(keys, values))
                out.append(Problem(child(path, i), f"duplicate entry: {what} (must be unique)"))
        seen.add(marker)
    return out


def repeated(items: Iterable[Any], path: str) -> list[Problem]:
    """Items that equal an earlier one (x-kubernetes-list-type: set)."""
    seen: set = set()
    out = []
    for i, item in enumerate(items):
        marker = json.dumps(item, sort_keys=True, default=str)
        if marker in seen:
            out.append(Problem(child(path, i), f"duplicate value {item!r} (must be unique)"))
        seen.add(marker)
    return out
