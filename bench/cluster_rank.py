"""Every rank of the cluster benchmark (`hvdk8s bench --render`): the allreduce sweep, then training
steps of each model through hvdk8s.torch. Rank 0 prints one line, MARK + JSON, which
`hvdk8s bench --from-logs` reads back from the launcher's log.

    python -m hvdk8s.bench.cluster_rank LABEL [MAX_BYTES [STEPS]]
"""
from __future__ import annotations

import json
import sys

MARK = "@hvdk8s-bench "
MODELS = ("mlp", "resnet", "transformer")
BATCH, STEPS = 64, 50


def main(label: str, max_bytes: int = 256 << 20, steps: int = STEPS) -> None:
    import horovod.torch as hvd

    from hvdk8s.bench import allreduce_rank, step_rank

    mode = step_rank.Mode("hvdk8s", "none")
    result = {"label": label, "ranks": hvd.size(), "nodes": hvd.cross_size(),
              "gpu": mode.device.type == "cuda", "allreduce": allreduce_rank.sweep(max_bytes), "samples_per_s": {}}
    for model in MODELS:
        seconds = step_rank.seconds_per_step({"model": model, "batch": BATCH, "steps": steps}, mode)
        result["samples_per_s"][model] = BATCH * hvd.size() / seconds
    if hvd.rank() == 0:
        # One write for the whole line: mpirun tags each write, and print() under PYTHONUNBUFFERED
        # writes the newline apart (a tag would then follow the JSON on the same line).
        sys.stdout.write(MARK + json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
