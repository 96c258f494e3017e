"""7. TensorFlow: `hvdk8s.tensorflow` with `model.fit` against plain single-process Keras at one rank
(the wrapper's cost), and at 2 ranks against 1 (scaling on this machine's cores)."""
from __future__ import annotations

from hvdk8s import tuning
from hvdk8s.bench.core import Comparison, Row, fast_mode_threshold, interleaved
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
        result = run_json(RANK_MODULE, {**config, "mode": mode}, "hvdk8s" if mode == "hvdk8s" else "plain", np,
                          tuning.ALLOCATORS)  # plain Keras with the allocator settings hvdk8s's ranks get
        epochs[label].extend(result["epochs"])
        return result["samples_per_s"]

    samples = interleaved({label: (lambda label=label: rate(label)) for label in configs}, repeats)

    def row(config: str, group: str, label: str) -> Row:
        return Row(config=config, group=group, samples=samples[label],
                   extra={"epochs_samples_per_s": [round(r, 1) for r in epochs[label]]})

    one_rank = {"plain Keras": "plain Keras", "hvdk8s": "hvdk8s, 1 rank"}  # row config: its run label
    rows = [row(config, "1 rank", label) for config, label in one_rank.items()]
    # The 1-rank epochs of both configurations pooled: where they fall into a fast and a slow mode, the
    # fast epochs of each are compared on their own, and each configuration's count of slow epochs shown.
    threshold = fast_mode_threshold([r for label in one_rank.values() for r in epochs[label]])
    notes = "Each run's rate is the median of its epochs after the first."
    if threshold is not None:
        shares = []
        for config, label in one_rank.items():
            fast = [r for r in epochs[label] if r >= threshold]
            slow = len(epochs[label]) - len(fast)
            rows.append(Row(config=config, group="1 rank, fast epochs", samples=fast or [0.0],
                            extra={"slow_epochs": slow, "epochs": len(epochs[label])}))
            shares.append(f"{config} {slow} of {len(epochs[label])}")
        notes += (f" The 1-rank epochs fall into two modes (split at {threshold:,.0f} samples/s); "
                  f"\"fast epochs\" compares each configuration's epochs above it (n: epochs). "
                  f"Slow epochs: {', '.join(shares)}.")
    rows += [row("1 rank", "hvdk8s scaling", "hvdk8s, 1 rank"), row("2 ranks", "hvdk8s scaling", "hvdk8s, 2 ranks")]
    return Comparison("tf_fit", "TensorFlow/Keras 3: model.fit through hvdk8s.tensorflow", "samples/s",
                      higher_is_better=True, rows=rows, notes=notes, target=">= 0.98x of plain Keras at 1 rank",
                      baseline={"1 rank": "plain Keras", "1 rank, fast epochs": "plain Keras",
                                "hvdk8s scaling": "1 rank"})
