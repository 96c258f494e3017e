"""Byte sizes as people write them (`50Gi`, `500M`) and as `ls` shows them."""
from __future__ import annotations

import re

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]i?)?b?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`50Gi` -> 53687091200; decimal (K, M, G, T) and binary (Ki, Mi, Gi, Ti) suffixes, as in Kubernetes."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 50Gi, 500M or 1048576")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def format_size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
