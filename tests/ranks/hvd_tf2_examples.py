"""Horovod's TensorFlow 2 examples as this project's scripts follow them (hvd_tf2_synthetic.py, the
synthetic benchmark on a Keras application; hvd_tf2_mnist.py, the GradientTape MNIST training;
hvd_tf2_keras_mnist.py, the Keras one), each run whole as its `__main__` with its own arguments, one after
the other on the same 2 ranks: one TensorFlow start for the three (seconds of each rank's CPU), as a
user's driver running them would. `hvd_tf2_examples.py DATA OUT`: they write into OUT/synthetic,
OUT/tape and OUT/keras."""
import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
data, out = sys.argv[1], Path(sys.argv[2])
for script, name, args in (("hvd_tf2_synthetic.py", "synthetic", ["--fp16-allreduce"]),
                           ("hvd_tf2_mnist.py", "tape", [data]), ("hvd_tf2_keras_mnist.py", "keras", [data])):
    (out / name).mkdir(parents=True, exist_ok=True)
    sys.argv = [str(here / script), *args, str(out / name)]
    runpy.run_path(str(here / script), run_name="__main__")

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
