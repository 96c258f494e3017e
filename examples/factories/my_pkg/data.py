"""A dataset factory: returns a map-style dataset (len() and [i] -> (x, y)); (x, y) arrays, or
{"train": ..., "test": ...} for a dataset with its own split, work too."""
import numpy as np


class NoisyDigits:
    """scikit-learn's digits with Gaussian noise added once (a fixed seed): 1,797 samples, 10 classes."""

    def __init__(self, noise: float):
        from sklearn.datasets import load_digits

        bunch = load_digits()
        rng = np.random.default_rng(0)
        self.x = (bunch.images / 16.0 + rng.normal(0.0, noise, bunch.images.shape)).astype(np.float32)
        self.y = bunch.target.astype(np.int64)
        self.classes = list(range(10))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def noisy_digits(noise: float = 0.1):
    return NoisyDigits(noise)
