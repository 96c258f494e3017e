"""What the hvd_tf2_* scripts share that is not Horovod's API (each script makes its Horovod calls itself,
as the example it follows does): the MNIST-shaped data and model, the synthetic batch, the benchmark's
arguments, digests of variables."""
import hashlib
from pathlib import Path

import numpy as np
import tensorflow as tf


def mnist_dataset(path: Path, seed: int) -> tf.data.Dataset:
    """The .npz the test wrote, as Horovod's MNIST examples feed keras.datasets.mnist: scaled to [0, 1],
    repeated, shuffled (`seed`: each rank its own order), batches of 32."""
    with np.load(path) as d:
        images, labels = d["x_train"], d["y_train"]
    dataset = tf.data.Dataset.from_tensor_slices((tf.cast(images[..., tf.newaxis] / 255.0, tf.float32),
                                                  tf.cast(labels, tf.int64)))
    return dataset.repeat().shuffle(1000, seed=seed).batch(32)


def build_mnist_model() -> tf.keras.Model:
    """A smaller relative of the examples' MNIST convnet (two ranks on a shared CPU)."""
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def benchmark_model(name: str) -> tf.keras.Model:
    """The synthetic benchmarks' model: a Keras application by name (as the examples' `--model`), built
    for 32x32 images of 10 classes; or, for a test whose point is the API rather than the model (tracing a
    Keras application costs two ranks on a shared CPU tens of seconds), "convnet": the MNIST convnet above
    on them."""
    if name == "convnet":
        return build_mnist_model()
    return getattr(tf.keras.applications, name)(weights=None, input_shape=(32, 32, 3), classes=10)


def benchmark_arguments(parser) -> None:
    """The synthetic benchmarks' options (smaller defaults than Horovod's)."""
    parser.add_argument("out", type=Path)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=2)


def synthetic_batch(batch_size: int):
    """Random 32x32 images and labels of 10 classes, for a Keras application built for them."""
    return (tf.random.uniform([batch_size, 32, 32, 3]),
            tf.random.uniform([batch_size, 1], minval=0, maxval=9, dtype=tf.int64))


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()[:16]
