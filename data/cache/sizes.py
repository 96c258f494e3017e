"""Byte sizes as people write them (Kubernetes quantities: `50Gi`, `500M`) and as `ls` shows them."""
from __future__ import annotations

from hvdk8s.core.quantity import parse_bytes

# The CLI's --quota parser: whole bytes in Kubernetes quantity syntax, the same as `cache_quota` in a job.
parse_size = parse_bytes


def format_size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
