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
    epochs: dict[str, list[float]] = {}

    def rate(mode: str, np: int) -> float:
        result = run_json(RANK_MODULE, {**config, "mode": mode}, "hvdk8s" if mode == "hvdk8s" else "plain", np)
        epochs.setdefault(f"{mode} x{np}", []).extend(result["epochs"])
        return result["samples_per_s"]

    samples = interleaved({"plain Keras": lambda: rate("keras", 1), "hvdk8s, 1 rank": lambda: rate("hvdk8s", 1),
                           "hvdk8s, 2 ranks": lambda: rate("hvdk8s", 2)}, repeats)
    def per_epoch(key: str) -> dict:
        return {"epochs_samples_per_s": [round(r, 1) for r in epochs.get(key, [])]}

    rows = [Row(config="plain Keras", group="1 rank", samples=samples["plain Keras"], extra=per_epoch("keras x1")),
            Row(config="hvdk8s", group="1 rank", samples=samples["hvdk8s, 1 rank"], extra=per_epoch("hvdk8s x1")),
            Row(config="1 rank", group="hvdk8s scaling", samples=samples["hvdk8s, 1 rank"], extra=per_epoch("hvdk8s x1")),
            Row(config="2 ranks", group="hvdk8s scaling", samples=samples["hvdk8s, 2 ranks"],
                extra=per_epoch("hvdk8s x2"))]
    return Comparison("tf_fit", "TensorFlow/Keras 3: model.fit through hvdk8s.tensorflow", "samples/s",
                      higher_is_better=True, baseline={"1 rank": "plain Keras", "hvdk8s scaling": "1 rank"},
                      rows=rows, target=">= 0.98x of plain Keras at 1 rank")
