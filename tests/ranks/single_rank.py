"""One Horovod rank started on its own (`python single_rank.py FRAMEWORK`): prints, as JSON, the cycle
time its environment gave Horovod, how often Horovod's background thread woke in a second of idleness,
and what hvdk8s's collectives and a raw Horovod allreduce returned. Run by tests/test_single_rank.py."""
import json
import os
import sys
import tempfile
import time

framework = sys.argv[1]


def wakeups(seconds: float) -> float:
    """Voluntary context switches per second of every thread but this one (Horovod's background thread
    sleeps out each cycle; idle intra-op threads wait on a condition and do not wake)."""
    def switches() -> int:
        total = 0
        for tid in os.listdir("/proc/self/task"):
            if int(tid) == os.getpid():
                continue
            with open(f"/proc/self/task/{tid}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))
        return total

    before = switches()
    time.sleep(seconds)
    return (switches() - before) / seconds


if framework == "pytorch":
    import torch

    import hvdk8s.torch as h
    import horovod.torch as hvd

    h.init()
    value = torch.tensor([1.5, -2.0])
    averaged = h.allreduce(value)
    copied = averaged is not value and averaged.data_ptr() != value.data_ptr()
    averaged, raw = averaged.tolist(), hvd.allreduce(value, op=hvd.Sum).tolist()
    layer = torch.nn.Linear(2, 1)
    before = [p.clone() for p in layer.parameters()]
    h.broadcast_state(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
    unchanged = all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))
    model, optimizer = layer, None
else:
    import numpy as np

    import hvdk8s.tensorflow as h
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    h.init()
    value = np.array([1.5, -2.0])
    averaged = h.allreduce(value)
    copied = averaged is not value
    averaged = averaged.tolist()
    raw = hvd.allreduce(tf.constant(value), op=hvd.Sum).numpy().tolist()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    before = [w.copy() for w in model.get_weights()]
    h.broadcast_state(model)
    unchanged = all((a == b).all() for a, b in zip(before, model.get_weights()))
    optimizer = None

with tempfile.TemporaryDirectory() as empty:
    resumed = h.load_checkpoint(empty, model, optimizer)
print(json.dumps({
    "size": h.size(), "cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"), "wakeups_per_s": wakeups(1.0),
    "allreduce": averaged, "copied": copied, "metric_sum": h.metric_sum(2.5), "metric_average": h.metric_average(4.0),
    "raw_sum": raw, "broadcast_unchanged": unchanged, "resumed": list(resumed),
}))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
