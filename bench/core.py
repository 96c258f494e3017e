"""What every benchmark shares: interleaved repeats, medians, ratios against a baseline in the same run.

A benchmark is a function `run(quick: bool) -> Comparison`. Its configurations are measured in turn,
A B C A B C ..., and each is summarised by its median, because these machines are shared and noisy:
only a ratio against a baseline measured in the same minutes means anything.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Union


class BenchError(RuntimeError):
    """A measured run failed (its ranks' exit status and output in the message): `hvdk8s bench` ends
    with it, exit 1."""


class CannotRunHere(RuntimeError):
    """A benchmark this machine cannot run (the message says what it lacks): skipped, the others run."""


@dataclass
class Row:
    config: str                     # what was measured, e.g. "hvdk8s" or "ddp, contended"
    samples: list[float]            # one value per repeat
    group: str = ""                 # rows of one group share a baseline (e.g. a model, or a tensor size)
    x: Optional[float] = None       # for plots along an axis (bytes, ranks, threshold)
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class Comparison:
    name: str                       # short id: "wrapper", "peers", ...
    title: str
    unit: str                       # "ms/step", "samples/s", "GB/s"
    higher_is_better: bool
    baseline: Union[str, dict]      # the config each group's ratios are against ({group: config} if they differ)
    rows: list[Row]
    target: Optional[str] = None    # e.g. "<= 1.02x"; stated, never asserted
    notes: str = ""
    plot: str = "bar"               # "bar", or "line" along Row.x (log scale)
    x_label: str = ""
    references: dict[str, float] = field(default_factory=dict)  # horizontal lines: {label: value}
    paired: bool = False            # each row's i-th sample was measured beside its baseline's i-th

    def ratio(self, row: Row) -> Optional[float]:
        """row's median over its group's baseline median, or where samples are paired the median of the
        per-pair ratios (None without a baseline in the group)."""
        config = self.baseline.get(row.group) if isinstance(self.baseline, dict) else self.baseline
        base = next((r for r in self.rows if r.group == row.group and r.config == config), None)
        if base is None or base.median == 0:
            return None
        if self.paired and len(row.samples) == len(base.samples) and all(base.samples):
            return statistics.median(r / b for r, b in zip(row.samples, base.samples))
        return row.median / base.median

    def to_json(self) -> dict:
        out = asdict(self)
        for row, data in zip(self.rows, out["rows"]):
            data["median"] = row.median
            data["ratio"] = self.ratio(row)
        return out


def fast_mode_threshold(values: list[float], min_gap: float = 1.15) -> Optional[float]:
    """Where `values` split into a slow and a fast mode, or None when they form one mode.

    The split is one-dimensional two-means (the cut that leaves the least squared spread within the
    two sides); the values are bimodal only when the fast side's mean is at least `min_gap` times the
    slow side's, so ordinary noise never splits."""
    ordered = sorted(values)
    best: Optional[tuple[float, int]] = None
    for cut in range(1, len(ordered)):
        slow, fast = ordered[:cut], ordered[cut:]
        spread = len(slow) * statistics.pvariance(slow) + len(fast) * statistics.pvariance(fast)
        if best is None or spread < best[0]:
            best = (spread, cut)
    if best is None:
        return None
    slow, fast = ordered[:best[1]], ordered[best[1]:]
    if statistics.fmean(fast) < min_gap * statistics.fmean(slow):
        return None
    return (slow[-1] + fast[0]) / 2


def interleaved(configs: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """{config: [value per repeat]}, measured A B C A B C ... so that drift in the machine's load
    falls on every configuration alike."""
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, measure in configs.items():
            samples[name].append(measure())
    return samples
