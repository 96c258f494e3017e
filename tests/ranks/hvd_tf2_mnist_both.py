"""Horovod's two TensorFlow 2 MNIST examples (hvd_tf2_mnist.py, the GradientTape one, then
hvd_tf2_keras_mnist.py), each run whole as its `__main__` with its own arguments, one after the other on the
same 2 ranks: one TensorFlow start for the two (seconds of each rank's CPU), as a user's driver running both
would. `hvd_tf2_mnist_both.py DATA OUT`: the GradientTape run writes into OUT/tape, the Keras one into
OUT/keras."""
import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
data, out = sys.argv[1], Path(sys.argv[2])
for script, name in (("hvd_tf2_mnist.py", "tape"), ("hvd_tf2_keras_mnist.py", "keras")):
    (out / name).mkdir(parents=True, exist_ok=True)
    sys.argv = [str(here / script), data, str(out / name)]
    runpy.run_path(str(here / script), run_name="__main__")
