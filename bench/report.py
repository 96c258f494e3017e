"""A benchmark run's report: results.json, README.md (tables with ratios) and one PNG per benchmark."""
from __future__ import annotations

import json
from pathlib import Path

from hvdk8s.bench.core import Comparison
from hvdk8s.core.atomic import atomic_path, atomic_write


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def markdown(comparisons: list[Comparison], machine: dict, quick: bool) -> str:
    lines = ["# hvdk8s benchmarks", "",
             f"Mode: {'quick (small sizes; a smoke check, not a measurement)' if quick else 'full'}. "
             "Configurations interleaved and repeated; medians; each ratio is against a baseline measured "
             "in the same run.", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None), ""]
    for c in comparisons:
        lines += [f"## {c.title}", ""]
        if c.target:
            lines += [f"Target: {c.target}.", ""]
        if c.paired:
            lines += ["Ratios: the median of per-sample ratios, each sample measured beside its baseline's.", ""]
        better = "higher is better" if c.higher_is_better else "lower is better"
        lines += [f"| group | config | median {c.unit} ({better}) | ratio | n |", "|---|---|---|---|---|"]
        for row in c.rows:
            ratio = c.ratio(row)
            lines.append(f"| {row.group or '-'} | {row.config} | {_fmt(row.median)} | "
                         f"{'-' if ratio is None else f'{ratio:.3f}x'} | {len(row.samples)} |")
        for label, value in c.references.items():
            lines.append(f"| reference | {label} | {_fmt(value)} | - | - |")
        lines.append("")
        if c.notes:
            lines += [c.notes, ""]
        lines += [f"![{c.name}]({c.name}.png)", ""]
    return "\n".join(lines)


def plot(c: Comparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    configs = list(dict.fromkeys(r.config for r in c.rows))
    groups = list(dict.fromkeys(r.group for r in c.rows))
    # matplotlib's default cycle has 10 colours: past that, two configurations would share one
    tab20 = plt.get_cmap("tab20").colors
    palette = [tab20[i % len(tab20)] for i in range(len(configs))] if len(configs) > 10 else [None] * len(configs)
    if c.plot == "line":
        for config, color in zip(configs, palette):
            rows = sorted((r for r in c.rows if r.config == config), key=lambda r: r.x)
            ax.plot([r.x for r in rows], [r.median for r in rows], marker="o", label=config, color=color)
        for label, value in c.references.items():
            ax.axhline(value, linestyle="--", color="grey", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(c.x_label)
    else:
        width = 0.8 / max(1, len(configs))
        for i, config in enumerate(configs):
            xs, heights, ratios = [], [], []
            for j, group in enumerate(groups):
                row = next((r for r in c.rows if r.group == group and r.config == config), None)
                if row is not None:
                    xs.append(j + i * width)
                    heights.append(row.median)
                    ratios.append(c.ratio(row))
            bars = ax.bar(xs, heights, width, label=config, color=palette[i])
            ax.bar_label(bars, labels=["" if r is None else f"{r:.2f}x" for r in ratios], fontsize=7)
        ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(groups))],
                      [g or c.name for g in groups], fontsize=8, rotation=15)
    ax.set_ylabel(c.unit)
    ax.set_title(c.title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as part:
        fig.savefig(part, dpi=100, format="png")
    plt.close(fig)


def write(out_dir: Path, comparisons: list[Comparison], machine: dict, quick: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "quick": quick, "benchmarks": [c.to_json() for c in comparisons]}
    atomic_write(out_dir / "results.json", json.dumps(payload, indent=1) + "\n")
    for c in comparisons:
        plot(c, out_dir / f"{c.name}.png")
    atomic_write(out_dir / "README.md", markdown(comparisons, machine, quick))
