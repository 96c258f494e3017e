"""hvdk8s.horovod.tensorflow in one process, without ranks: Horovod's names are all there with Horovod's
signatures, what Keras 3 no longer allows is refused with the replacement named, and the tf.keras 2
spellings Horovod's scripts use are accepted. (2-rank behaviour: tests/test_horovod_tf2.py.)"""
import importlib
import inspect

import pytest

pytestmark = pytest.mark.tensorflow_here  # on the one worker that imports TensorFlow (tests/workgroups.py)


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow and Horovod, imported when these tests run rather than when pytest collects the file:
    every worker of scripts/test.sh collects every file, and this import took 4-5 CPU-s of each."""
    global hvd, horovod_tf, horovod_keras, keras, tf, hvdk
    hvd = pytest.importorskip("hvdk8s.horovod.tensorflow")
    import horovod.tensorflow as horovod_tf
    import horovod.tensorflow.keras as horovod_keras
    import keras
    import tensorflow as tf

    import hvdk8s.horovod.tensorflow.keras as hvdk


TF_NAMES = ["init", "shutdown", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "allreduce",
            "grouped_allreduce", "allgather", "broadcast", "broadcast_variables", "broadcast_object",
            "allgather_object", "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer",
            "Compression", "Average", "Sum", "Adasum", "ProcessSet", "global_process_set", "SyncBatchNormalization",
            "broadcast_global_variables", "join", "start_timeline", "stop_timeline"]
KERAS_NAMES = ["init", "rank", "size", "DistributedOptimizer", "allreduce", "allgather", "broadcast", "reducescatter",
               "load_model", "broadcast_global_variables", "Compression", "Average", "Sum"]
CALLBACKS = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
             "LearningRateWarmupCallback", "BestModelCheckpoint"]
ELASTIC = ["run", "TensorFlowKerasState", "TensorFlowState"]
KERAS_ELASTIC = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"]


def params(f) -> list[str]:
    return list(inspect.signature(f).parameters)


@pytest.mark.parametrize("module, names", [
    ("tensorflow", TF_NAMES), ("tensorflow.keras", KERAS_NAMES), ("tensorflow.keras.callbacks", CALLBACKS),
    ("tensorflow.elastic", ELASTIC), ("tensorflow.keras.elastic", KERAS_ELASTIC)],
    ids=["tensorflow", "keras", "callbacks", "elastic", "keras.elastic"])
def test_every_name_is_there_with_horovods_parameters(module, names):
    ours, theirs = (importlib.import_module(f"{prefix}.{module}") for prefix in ("hvdk8s.horovod", "horovod"))
    for name in names:
        mine, horovods = getattr(ours, name), getattr(theirs, name)
        if callable(horovods) and not isinstance(horovods, type(hvd.Average)):
            target = horovods.__init__ if inspect.isclass(horovods) else horovods
            own = mine.__init__ if inspect.isclass(mine) else mine
            if params(target) == ["args", "kwargs"]:  # horovod.tensorflow.init wraps its basics' init
                target = horovod_tf.mpi_ops._basics.init
            assert params(own) == params(target), name


@pytest.mark.parametrize("call, names", [
    (lambda: hvd.broadcast_global_variables(0), ["broadcast_variables(model.variables"]),
    (lambda: hvd.BroadcastGlobalVariablesHook(0), ["TensorFlow 1", "broadcast_variables"]),
    (lambda: hvdk.broadcast_global_variables(0), ["broadcast_variables(model.variables"]),
    (lambda: hvdk.load_model("m.keras", legacy_opts=True), ["Keras 3 removed", "without legacy_opts"]),
    (lambda: hvdk.callbacks.BestModelCheckpoint(), ["keras.callbacks.ModelCheckpoint", "save_best_only"]),
    (lambda: hvd.elastic.TensorFlowState(), ["pass e.g. model.variables"]),
    (lambda: hvd.DistributedOptimizer(object()), ["Keras 3 optimizer"]),
    (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Adasum), ["Adasum"]),
    (lambda: hvd.DistributedGradientTape(None, op=hvd.Sum, gradient_predivide_factor=2.0), ["op != Average"]),
], ids=["broadcast_global_variables", "hook", "keras broadcast_global_variables", "legacy_opts", "BestModelCheckpoint",
        "TensorFlowState", "not an optimizer", "adasum", "predivide with Sum"])
def test_what_keras_3_no_longer_allows_is_refused_naming_the_replacement(call, names):
    with pytest.raises((NotImplementedError, ValueError, TypeError)) as e:
        call()
    for text in names:
        assert text in str(e.value)


def test_keras_3_takes_the_tf_keras_2_spellings_of_horovods_scripts():
    opt = keras.optimizers.SGD(0.1)
    assert opt.variables() == opt.variables and isinstance(opt.variables, list)
    assert opt.lr is opt.learning_rate
    opt.lr = 0.5
    assert float(opt.learning_rate) == 0.5
    tf.keras.backend.set_value(opt.lr, 0.25)  # as Horovod's elastic Keras example resets the rate
    assert float(opt.learning_rate) == 0.25 and tf.keras.backend.get_value(opt.lr) == 0.25
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    assert lso.variables() == lso.variables
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  experimental_run_tf_function=False)
    assert model.jit_compile is False  # Horovod's ops have no XLA kernels
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
    assert model.jit_compile is True  # a plain optimizer: Keras 3's choice stands


def test_compile_under_mixed_float16_loss_scales_with_the_allreduce_before_the_overflow_check():
    """Keras 3's compile wraps the optimizer in a LossScaleOptimizer under mixed_float16 (Horovod's elastic
    Keras example turns it on with --use-mixed-precision): Keras's own would check each rank's gradients
    before the distributed optimizer reduces them, and a rank that overflowed alone would skip the
    allreduce the other waits in. The wrapper compile gets reduces first (its 2-rank run, an overflow on
    one rank: test_horovod_tf2.py), around the very optimizer given to compile, which keeps its state and
    settings across compiles."""
    from hvdk8s import tensorflow as htf

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        dist = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.25, momentum=0.5), backward_passes_per_step=2,
                                         compression=hvd.Compression.fp16)
        model.compile(optimizer=dist, loss="mse", experimental_run_tf_function=False)
        opt = model.optimizer
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and isinstance(opt, htf._Distributed)
        assert opt.inner_optimizer is dist and opt._hvdk8s_reduce == dist._hvdk8s_reduce
        assert not dist._hvdk8s_reduced_outside  # only within the wrapper's apply
        opt.register_local_var(model.layers[0].kernel)  # on either: the inner optimizer holds it
        assert dist._hvdk8s_local == {id(model.layers[0].kernel)} == opt._hvdk8s_local
        model.compile(optimizer=dist, loss="mse")  # again (e.g. after unfreezing layers): the same inner
        assert model.optimizer.inner_optimizer is dist
        model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                      auto_scale_loss=False)
        assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        sharded = htf.distribute(model, keras.optimizers.Adam(), shard_optimizer_state=1, broadcast=False,
                                 compression=hvd.Compression.none)
        with pytest.raises(ValueError, match="distribute a keras.optimizers.LossScaleOptimizer yourself"):
            model.compile(optimizer=sharded, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_distributed_optimizer_keeps_class_settings_and_state():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = keras.optimizers.Adam(0.01, beta_1=0.8)
    opt.build(model.trainable_variables)
    opt.variables[-1].assign(opt.variables[-1] + 1.0)
    dist = hvd.DistributedOptimizer(opt, backward_passes_per_step=2)
    assert isinstance(dist, keras.optimizers.Adam) and dist.beta_1 == 0.8 and dist.gradient_accumulation_steps == 2
    assert [v.numpy().tolist() for v in dist.variables[-1:]] == [v.numpy().tolist() for v in opt.variables[-1:]]


def test_powersgd_is_an_optimizers_not_one_allreduces_naming_the_choices():
    """PowerSGD keeps state per variable (hvdk8s.tensorflow.distribute has it: test_powersgd.py); a script
    asking for it as one allreduce's compressor hears which compressions there are, not a KeyError."""
    import hvdk8s.tensorflow as htf

    with pytest.raises(ValueError, match="compression 'powersgd' is an optimizer's .* here choose one of auto, "
                                         "fp16, none"):
        htf.compressor("powersgd")


@pytest.mark.parametrize("kwargs, says", [
    ({"powersgd": {"rank": 2}}, "powersgd settings given, but compression is not 'powersgd'"),
    ({"compression": "powersgd", "powersgd": {"rnak": 2}}, "powersgd: unknown setting(s) rnak"),
    ({"compression": "powersgd", "powersgd": {"rank": 0}}, "powersgd rank must be a whole number >= 1"),
    ({"compression": "powersgd", "prescale_factor": 2.0}, "Horovod's op and options (prescale_factor) do not apply"),
])
def test_distribute_names_what_powersgd_cannot_take(kwargs, says):
    import hvdk8s.tensorflow as htf

    # No Horovod init in this process: each refusal comes before distribute's first collective, and an
    # MPI singleton's init would leave PMIx variables in the C environment of every process it starts.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError) as e:
        htf.distribute(model, keras.optimizers.SGD(0.1), **kwargs)
    assert says in str(e.value)


@pytest.mark.parametrize("optimizer, kwargs, says", [
    (lambda: keras.optimizers.SGD(0.1, clipnorm=1.0), {}, "clipnorm clips each tensor by its own norm, and a "
                                                          "rank holds parts of tensors: use global_clipnorm"),
    (lambda: keras.optimizers.SGD(0.1, use_ema=True), {}, "use_ema keeps averages of the whole variables"),
    (lambda: keras.optimizers.SGD(0.1), {"compression": "powersgd"}, "compression 'powersgd' and "
                                                                     "shard_optimizer_state: one or the other"),
    (lambda: keras.optimizers.SGD(0.1), {"prescale_factor": 2.0}, "Horovod's op and options do not apply"),
    (lambda: keras.optimizers.SGD(0.1), {"shard_optimizer_state": 3}, "shard_optimizer_state must be 0, 1 or 2"),
])
def test_distribute_names_what_a_sharded_optimizer_cannot_take(optimizer, kwargs, says):
    import hvdk8s.tensorflow as htf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])  # no Horovod init: as above
    with pytest.raises(ValueError) as e:
        htf.distribute(model, optimizer(), **{"shard_optimizer_state": 1, **kwargs})
    assert says in str(e.value)
