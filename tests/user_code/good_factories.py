"""Dataset factories returning each kind of result hvdk8s takes besides a map-style dataset (which
examples/factories/my_pkg/data.py returns): tests/test_user_code.py loads and reads each."""
import numpy as np

SAMPLES, FEATURES, CLASSES = 60, 5, 3


def _arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    return x, (np.arange(SAMPLES) % CLASSES).astype(np.int64)


def arrays():
    """(x, y) arrays: hvdk8s splits off dataset.test_fraction."""
    return _arrays()


class OwnProtocol:
    """A dataset in hvdk8s's own protocol (take, epoch_order, info, len), written by a user."""

    def __init__(self):
        self.x, self.y = _arrays()
        self.info = {"input_shape": [FEATURES], "num_classes": CLASSES}
        self.taken = 0

    def __len__(self):
        return len(self.y)

    def take(self, indices):
        self.taken += len(indices)
        return self.x[indices], self.y[indices]

    def epoch_order(self, seed, epoch):
        return np.random.default_rng([seed, epoch]).permutation(len(self))


def protocol():
    return OwnProtocol()


class Rows:
    """Map-style: one (x, y) per index; `targets` (as torchvision's datasets have) tells the classes."""

    def __init__(self, x, y, labelled=True):
        self.x, self.y = x, y
        if labelled:
            self.targets = y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def own_split():
    """A dataset with its own split, each part a different kind."""
    x, y = _arrays()
    return {"train": Rows(x[:40], y[:40]), "test": (x[40:], y[40:])}


def unlabelled_rows():
    """Map-style with nothing that tells the number of classes: a model needing it must be told."""
    x, y = _arrays()
    return Rows(x, y, labelled=False)
