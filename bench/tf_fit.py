"""7. TensorFlow: `hvdk8s.tensorflow` with `model.fit` against plain single-process Keras at one rank
(the wrapper's cost), and at 2 ranks against 1 (scaling on this machine's cores)."""
from __future__ import annotations

from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import run_json

RANK_MODULE = "hvdk8s.bench.tf_fit_rank"


def run(quick: bool) -> Comparison:
    # Each run's rate is the median of its epochs after the first: TensorFlow's CPU epochs here are
    # either fast or about 1.5x slower (one core left idle), a third of them slow, in any configuration.
    config = {"samples": 1024 if quick else 8192, "epochs": 2 if quick else 6}
    repeats = 1 if quick else 3
    configs = {"plain Keras": ("keras", 1), "hvdk8s, 1 rank": ("hvdk8s", 1), "hvdk8s, 2 ranks": ("hvdk8s", 2)}
    epochs: dict[str, list[float]] = {label: [] for label in configs}  # every counted epoch's rate, kept

    def rate(label: str) -> float:
        mode, np = configs[label]
        result = run_json(RANK_MODULE, {**config, "mode": mode}, "hvdk8s" if mode == "hvdk8s" else "plain", np)
        epochs[label].extend(result["epochs"])
        return result["samples_per_s"]

    samples = interleaved({label: (lambda label=label: rate(label)) for label in configs}, repeats)

    def row(config: str, group: str, label: str) -> Row:
        return Row(config=config, group=group, samples=samples[label],
                   extra={"epochs_samples_per_s": [round(r, 1) for r in epochs[label]]})

    rows = [row("plain Keras", "1 rank", "plain Keras"), row("hvdk8s", "1 rank", "hvdk8s, 1 rank"),
            row("1 rank", "hvdk8s scaling", "hvdk8s, 1 rank"), row("2 ranks", "hvdk8s scaling", "hvdk8s, 2 ranks")]
    return Comparison("tf_fit", "TensorFlow/Keras 3: model.fit through hvdk8s.tensorflow", "samples/s",
                      higher_is_better=True, baseline={"1 rank": "plain Keras", "hvdk8s scaling": "1 rank"},
                      rows=rows, target=">= 0.98x of plain Keras at 1 rank")
