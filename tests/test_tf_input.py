"""TensorFlow in one process: the tf.data pipeline yields exactly the batches of the epoch plan, and
the distributed Keras optimizer allreduces once per update under gradient accumulation."""
import numpy as np
import pytest

from hvdk8s.data.datasets import ArrayDataset, IndexSubset, MapDataset
from hvdk8s.data.rankplans import plan_epoch, step_counts

pytestmark = pytest.mark.tensorflow_here  # on the one worker that imports TensorFlow (tests/workgroups.py)


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow, imported when these tests run rather than when pytest collects the file (every worker
    of scripts/test.sh collects every file; test_horovod_tf2_api.py says what it cost)."""
    global tf, tfdata
    import tensorflow as tf

    from hvdk8s.data import tensorflow as tfdata


def arrays(n: int) -> ArrayDataset:
    """Sample i is recognisable: x = [i, -i] as float32, y = i."""
    i = np.arange(n)
    return ArrayDataset(np.stack([i, -i], 1).astype(np.float32), i.astype(np.int64))


class UserData:
    """A user's map-style dataset (not in memory as far as hvdk8s can tell)."""

    def __init__(self, n: int):
        self.data = arrays(n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data.x[i], self.data.y[i]


class Augmented(ArrayDataset):
    """A subclass whose take differs from its arrays: the pipeline must go through take."""

    def take(self, indices):
        x, y = super().take(indices)
        return x + 0.5, y


def reference(dataset, batch_size, rank, size, seed, shuffle, epoch, weight_scale=1.0):
    """The batches straight from plan_epoch, one dataset.take each."""
    order = dataset.epoch_order(seed, epoch) if shuffle else np.arange(len(dataset))
    plan = plan_epoch(order, rank, size, batch_size)
    out = []
    for indices, global_count in zip(plan.batches(), plan.global_counts):
        scale = weight_scale * size / float(global_count)
        if len(indices) == 0:  # this rank's part has run out: one sample at weight 0
            indices, scale = (plan.indices[:1] if len(plan.indices) else np.zeros(1, np.int64)), 0.0
        x, y = dataset.take(indices)
        out.append((x, y, np.full(len(x), scale, np.float32)))
    return out


def check_epochs(dataset, batch_size, rank, size, seed=3, shuffle=True, first_epoch=2, weight_scale=1.0):
    data = tfdata.sharded_dataset(dataset, batch_size, rank=rank, size=size, seed=seed, shuffle=shuffle,
                                  first_epoch=first_epoch, weights=True, weight_scale=weight_scale)
    steps = len(step_counts(len(dataset), size, batch_size))
    assert int(data.cardinality()) == steps
    x0, y0 = dataset.take(np.arange(1))
    assert data.element_spec == (tf.TensorSpec((None, *x0.shape[1:]), tf.as_dtype(x0.dtype)),
                                 tf.TensorSpec((None, *y0.shape[1:]), tf.as_dtype(y0.dtype)),
                                 tf.TensorSpec((None,), tf.float32))
    for epoch in (first_epoch, first_epoch + 1):  # each pass is the next epoch
        got = [tuple(t.numpy() for t in batch) for batch in data]
        want = reference(dataset, batch_size, rank, size, seed, shuffle, epoch, weight_scale)
        assert len(got) == len(want) == steps
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a, b)


# (size, rank, batch_size, samples): even, uneven, a last short batch, ranks with an empty part
CASES = [(1, 0, 32, 100), (2, 0, 7, 103), (2, 1, 7, 103), (3, 2, 4, 10), (3, 0, 4, 10), (4, 3, 5, 3),
         (4, 0, 5, 3), (5, 4, 2, 21)]


@pytest.mark.parametrize("size,rank,batch_size,n", CASES)
def test_in_memory_batches_are_the_plans(size, rank, batch_size, n):
    check_epochs(arrays(n), batch_size, rank, size)


@pytest.mark.parametrize("size,rank,batch_size,n", CASES[1:6])
def test_other_datasets_batches_are_the_plans(size, rank, batch_size, n):
    check_epochs(MapDataset(UserData(n)), batch_size, rank, size)
    check_epochs(Augmented(*arrays(n).take(np.arange(n))), batch_size, rank, size, weight_scale=0.25)


def test_subsets_unshuffled_and_large_arrays(monkeypatch):
    subset = np.array([9, 2, 7, 4, 0, 5, 11])
    check_epochs(IndexSubset(arrays(12), subset), 2, 1, 2)            # gathered through the subset's indices
    check_epochs(IndexSubset(MapDataset(UserData(12)), subset), 2, 0, 2)
    check_epochs(arrays(11), 3, 1, 2, shuffle=False)
    monkeypatch.setattr(tfdata, "_IN_PIPELINE_BYTES", 0)  # too big to copy: read through take
    check_epochs(arrays(11), 3, 1, 2)


def test_without_weights_yields_x_and_y():
    data = tfdata.sharded_dataset(arrays(10), 4, rank=1, size=3, seed=1)
    want = reference(arrays(10), 4, 1, 3, 1, True, 1)
    got = [tuple(t.numpy() for t in batch) for batch in data]
    assert [len(g) for g in got] == [2] * len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g[0], w[0])
        np.testing.assert_array_equal(g[1], w[1])


# --- the distributed Keras optimizer, at one rank -------------------------------------------------

@pytest.fixture(scope="module")
def htf():
    import horovod.tensorflow as hvd

    import hvdk8s.tensorflow as htf

    hvd.init()  # one rank, in this process (htf.init would also set TF's threads, too late here)
    return htf


def count_allreduces(htf, monkeypatch):
    """Patch allreduce_gradients to count the times it runs, eagerly or inside a tf.function (a
    variable's assign, which a branch not taken does not run)."""
    calls = tf.Variable(0)
    real = htf.allreduce_gradients

    def counted(grads, **kwargs):
        calls.assign_add(1)
        return real(grads, **kwargs)

    monkeypatch.setattr(htf, "allreduce_gradients", counted)
    return calls


MICRO = [[np.array([1.0, -2.0], np.float32), np.array([[0.5]], np.float32)],
         [np.array([3.0, 0.0], np.float32), np.array([[-1.5]], np.float32)],
         [np.array([-1.0, 4.0], np.float32), np.array([[2.0]], np.float32)],
         [np.array([0.5, 0.5], np.float32), np.array([[1.0]], np.float32)]]


@pytest.mark.parametrize("graph", [False, True])
def test_accumulation_allreduces_once_per_update(htf, monkeypatch, graph):
    import keras

    calls = count_allreduces(htf, monkeypatch)
    settings = {"learning_rate": 0.1, "momentum": 0.9, "global_clipnorm": 1.0}
    init = [np.array([0.3, -0.2], np.float32), np.array([[1.0]], np.float32)]
    model = keras.Sequential()  # not built: distribute broadcasts nothing
    dist = htf.distribute(model, keras.optimizers.SGD(**settings), backward_passes_per_step=2)
    assert isinstance(dist, htf._Distributed) and isinstance(dist, keras.optimizers.SGD)
    mine = [keras.Variable(v) for v in init]

    def apply(*grads):
        dist.apply(list(grads), mine)
    apply = tf.function(apply) if graph else apply  # graph: as in model.fit
    for grads in MICRO:
        apply(*grads)
    assert int(calls.numpy()) == 2 and int(dist.iterations) == 2

    plain = keras.optimizers.SGD(**settings)  # the same two updates, on the averaged micro-batches
    ref = [keras.Variable(v) for v in init]
    for a, b in (MICRO[0:2], MICRO[2:4]):
        plain.apply([(ga + gb) / 2 for ga, gb in zip(a, b)], ref)
    for v, r in zip(mine, ref):
        np.testing.assert_allclose(np.asarray(v), np.asarray(r), rtol=1e-6, atol=1e-7)
    for grads in MICRO[:2]:  # the base class's apply is a local step (one rank alone may take it)
        keras.optimizers.SGD.apply(dist, grads, mine)
    assert int(calls.numpy()) == 2 and int(dist.iterations) == 3
    with pytest.raises(ValueError):
        htf.distribute(model, dist)


def test_loss_scale_optimizer_allreduces_every_micro_batch(htf, monkeypatch):
    """Before its finiteness check (see hvdk8s.tensorflow): all ranks must take the same branch."""
    import keras

    calls = count_allreduces(htf, monkeypatch)
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    dist = htf.distribute(keras.Sequential(), lso, backward_passes_per_step=2)
    assert isinstance(dist, htf._Distributed) and type(dist.inner_optimizer) is keras.optimizers.SGD
    mine = [keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros((1, 1), np.float32))]
    for grads in MICRO:
        dist.apply(grads, mine)
    assert int(calls.numpy()) == 4
