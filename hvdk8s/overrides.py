"""`--set FIELD.PATH=VALUE`: a change to a job document typed on the command line, the value read as YAML.

A list is set whole (`--set 'kubernetes.volumes=[{name: data, mount_path: /data, pvc: x}]'`), never one
item by index: an index would leave the other items' meaning to guess. A path that goes into a list
is refused with the whole list, changed as asked, spelt out as the `--set` to type instead."""
from __future__ import annotations

import copy
import re
import shlex
from typing import Any, Optional

import yaml

from hvdk8s.core import safeyaml

_INDEX = re.compile(r"^(?P<name>[^\[\]]*)\[(?P<index>[^\]]*)\]")


class OverrideError(ValueError):
    """An override that cannot be applied; `field` is the path it names."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def applied(data: dict, overrides: list[str]) -> dict:
    """`data` with each `field.path=value` of `overrides` applied in turn, as a copy."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise OverrideError(item, f"--set {item} has no '=': write --set {item}=VALUE (no spaces around '=')")
        if not key:
            raise OverrideError(item, f"--set {item} names no field before '=': write --set FIELD.PATH=VALUE")
        try:
            value = safeyaml.load_value(raw)
        except safeyaml.YAMLInputError as e:
            raise OverrideError(key, f"--set value {raw[:80]!r}: {e}") from None
        _set(data, key, value)
    return data


def _set(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for n, part in enumerate(parts):
        indexed = _INDEX.match(part)
        if indexed:  # `volumes[0]`
            current = node.get(indexed["name"]) if isinstance(node, dict) else None
            inner = parts[n + 1:] if indexed.end() == len(part) else None  # `[0][1]`: no example offered
            _refuse_item(key, parts[:n] + [indexed["name"]], current, indexed["index"], inner, value)
        if isinstance(node, list):  # `volumes.0`
            _refuse_item(key, parts[:n], node, part, parts[n + 1:], value)
        if n == len(parts) - 1:
            node[part] = value
            return
        node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise OverrideError(key, f"cannot set a field inside {part!r}, which is not a mapping")


def _refuse_item(key: str, list_path: list[str], current: Any, index: str, inner: Optional[list[str]],
                 value: Any) -> None:
    """Raise: `key` goes into a list. Say how to set the list whole: with its items, the one at `index`
    changed as asked, where the job file has that item; else with `[...]`."""
    field = ".".join(list_path)
    whole = _with_item_set(current, index, inner, value)
    shown = "[...]" if whole is None else yaml.safe_dump(whole, default_flow_style=True, sort_keys=False,
                                                          width=float("inf")).strip()
    raise OverrideError(key, f"{field} is a list, and a list is set whole, not item by item: "
                             f"--set {shlex.quote(f'{field}={shown}')}")


def _with_item_set(current: Any, index: str, inner: Optional[list[str]], value: Any) -> Optional[list]:
    """A copy of the list `current` with `[index].inner...` set to `value`, or None where that is not
    plain (no list yet, an index out of range, an item that is not a mapping)."""
    if not isinstance(current, list) or inner is None or not re.fullmatch(r"[0-9]+", index):
        return None
    if int(index) >= len(current):
        return None
    changed = copy.deepcopy(current)
    if not inner:
        changed[int(index)] = value
        return changed
    node = changed[int(index)]
    for part in inner[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return None
    node[inner[-1]] = value
    return changed
