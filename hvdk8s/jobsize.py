"""The job the ranks receive, within a bound: `spec.dump_job`'s YAML is a file locally and a key of the job's
ConfigMap on a cluster, and Kubernetes refuses a ConfigMap over 1 MiB. Free-form fields (a factory's `args`,
`entrypoint.args`, `kubernetes.env`) pass every field rule however large they are, and YAML aliases let a
small file expand to megabytes; such a job is refused here, naming its largest part.

MAX_JOB_BYTES plus the largest carried script (`entrypoint.MAX_CARRIED_BYTES`) leaves the ConfigMap room
under 1 MiB. The dump is measured as it is written and stopped past the bound, so a huge job costs no more
than a job at the bound.
"""
from __future__ import annotations

import io
from typing import Any

import yaml

from hvdk8s.spec import JobSpec

MAX_JOB_BYTES = 256 * 1024


class _Full(Exception):
    pass


class _Meter(io.TextIOBase):
    """A text stream that only counts UTF-8 bytes, and raises _Full once past `limit`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.size = 0

    def write(self, text: str) -> int:
        self.size += len(text.encode("utf-8", "surrogatepass"))
        if self.size > self.limit:
            raise _Full
        return len(text)


def dumped_size(spec: JobSpec, limit: int = MAX_JOB_BYTES) -> int | None:
    """The bytes of `spec.dump_job(spec)` (written the same way), or None once they pass `limit`."""
    meter = _Meter(limit)
    try:
        yaml.safe_dump(spec.model_dump(mode="json"), meter, sort_keys=False)  # as spec.dump_job writes it
    except _Full:
        return None
    return meter.size


def _weights(node: Any, into: dict[int, int]) -> int:
    """A rough size of `node` written out (its scalars' lengths), for every list and mapping in it."""
    stack, order = [node], []
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list)) and id(item) not in into:
            into[id(item)] = 0
            order.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    for item in reversed(order):  # children before their parents
        children = list(item.items()) if isinstance(item, dict) else list(enumerate(item))
        into[id(item)] = sum(len(str(k)) + 4 + into.get(id(v), len(str(v))) for k, v in children)
    return into.get(id(node), len(str(node)))


def largest_part(data: dict) -> str:
    """The field path of the part that makes `data` large: the biggest child, level by level, while it
    holds at least half of its parent (else the parent's size is spread out, and the parent is named)."""
    weights: dict[int, int] = {}
    _weights(data, weights)
    path, node = "", data
    while isinstance(node, (dict, list)) and node:
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        key, child = max(children, key=lambda kv: weights.get(id(kv[1]), len(str(kv[1]))))
        if 2 * weights.get(id(child), len(str(child))) < weights[id(node)]:
            break
        path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        node = child
    return path


def problems(spec: JobSpec) -> list[tuple[str, str]]:
    """[] for a job within MAX_JOB_BYTES, else one (field path, message) naming its largest part."""
    if dumped_size(spec) is not None:
        return []
    return [(largest_part(spec.model_dump(mode="json")),
             f"the job is larger than {MAX_JOB_BYTES // 1024} KiB written out (as the ranks receive it, YAML "
             "aliases expanded): its ConfigMap would pass Kubernetes' 1 MiB limit; this part is the largest")]
