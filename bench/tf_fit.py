"""7. TensorFlow: `hvdk8s.tensorflow` with `model.fit` against plain single-process Keras at one rank
(the wrapper's cost), and at 2 ranks against 1 (scaling on this machine's cores)."""
from __future__ import annotations

from hvdk8s.bench.core import Comparison, Row, interleaved
from hvdk8s.bench.ranks import run_json

RANK_MODULE = "hvdk8s.bench.tf_fit_rank"


def run(quick: bool) -> Comparison:
    config = {"samples": 1024 if quick else 8192, "epochs": 2}
    repeats = 1 if quick else 2

    def rate(mode: str, np: int) -> float:
        return run_json(RANK_MODULE, {**config, "mode": mode}, "hvdk8s" if mode == "hvdk8s" else "plain",
                        np)["samples_per_s"]

    samples = interleaved({"plain Keras": lambda: rate("keras", 1), "hvdk8s, 1 rank": lambda: rate("hvdk8s", 1),
                           "hvdk8s, 2 ranks": lambda: rate("hvdk8s", 2)}, repeats)
    rows = [Row(config="plain Keras", group="1 rank", samples=samples["plain Keras"]),
            Row(config="hvdk8s", group="1 rank", samples=samples["hvdk8s, 1 rank"]),
            Row(config="1 rank", group="hvdk8s scaling", samples=samples["hvdk8s, 1 rank"]),
            Row(config="2 ranks", group="hvdk8s scaling", samples=samples["hvdk8s, 2 ranks"])]
    return Comparison("tf_fit", "TensorFlow/Keras 3: model.fit through hvdk8s.tensorflow", "samples/s",
                      higher_is_better=True, baseline={"1 rank": "plain Keras", "hvdk8s scaling": "1 rank"},
                      rows=rows, target=">= 0.98x of plain Keras at 1 rank")
