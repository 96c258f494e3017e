"""Horovod's TensorFlow 2 API on Keras 3 (hvdk8s.horovod.tensorflow): scripts of this project's own that
call exactly the API of Horovod's TF2 examples (the synthetic benchmark, the GradientTape and Keras MNIST
trainings, the elastic synthetic benchmark) run on 2 real ranks with only the import naming hvdk8s, and
DistributedGradientTape and DistributedOptimizer at 2 ranks equal one process on the whole batch."""
import json
import re
import shutil

import numpy as np
import pytest
import yaml

from conftest import RANK_SCRIPTS, elastic_launch, rank_results, run_ranks

pytestmark = pytest.mark.ranks


def mnist_like(path):
    """An MNIST-shaped .npz (28x28 uint8 images, labels 0-9, keras.datasets.mnist's keys) of scikit-learn's
    digits, scaled up: real digits to learn, no download."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))) * (255 / 16)
    images, labels = images.astype("uint8"), digits.target.astype("uint8")
    np.savez(path, x_train=images[:1500], y_train=labels[:1500], x_test=images[1500:], y_test=labels[1500:])
    return path


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """The synthetic benchmark and both MNIST examples in one launch (tests/ranks/hvd_tf2_examples.py):
    its output and the three scripts' folders."""
    out = tmp_path_factory.mktemp("hvd-tf2-examples")
    proc = run_ranks("hvd_tf2_examples.py", mnist_like(out / "mnist.npz"), out)
    return proc, out / "synthetic", out / "tape", out / "keras"


def test_the_synthetic_benchmark_runs_and_leaves_the_ranks_equal(examples):
    """DistributedGradientTape in a tf.function, then broadcast_variables of model.variables and of
    opt.variables() after the first step (what failed on Keras 3 with 'Variable' object has no attribute 'ref'),
    on a Keras application (MobileNetV3Small, the example's --model here; its batch normalization's moving
    statistics are what model.variables adds to the trainable ones). The trainable variables end equal
    (the moving statistics follow each rank's own data). With --fp16-allreduce, the example's compression
    path; the tape without compression is the equivalence tests' (below), which also check fp16 against
    one process."""
    proc, out, _, _ = examples
    r0, r1 = rank_results(out)
    assert r0["size"] == 2 and r0["initial"] != r1["initial"], "the ranks should start from different weights"
    assert r0["final"] == r1["final"] and r0["optimizer"] == r1["optimizer"]
    assert r0["iterations"] == 1 + 2 + 3 * 2
    assert "Model: MobileNetV3Small," in proc.stdout
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+", proc.stdout), proc.stdout


def test_the_gradient_tape_mnist_training_learns(examples):
    proc, _, out, _ = examples
    r0, r1 = rank_results(out)
    assert r0["weights"] == r1["weights"]
    assert np.mean(r0["last_losses"]) < 0.5 * np.mean(r0["first_losses"]), r0
    assert proc.stdout.count("Step #0\t") == 1  # rank 0 prints
    assert list((out / "checkpoints").glob("ckpt-1.index"))


def test_the_keras_mnist_training_learns_with_the_callbacks(examples):
    proc, _, _, out = examples
    r0, r1 = rank_results(out)
    assert r0["weights"] == r1["weights"]
    assert r0["history"] == r1["history"], "MetricAverageCallback gives every rank the same metrics"
    acc, lr = r0["history"]["accuracy"], r0["history"]["lr"]
    assert acc[-1] > 0.7 and acc[-1] > acc[0], r0
    # LearningRateWarmupCallback: from 0.002/2 towards 0.002 over 2 epochs, then held.
    assert lr[0] == pytest.approx(0.002 / 2 * (1 * 1 / 2 + 1)) and lr[1] == lr[2] == pytest.approx(0.002)
    assert "finished gradual learning rate warmup to 0.002" in proc.stdout
    assert not r0["jit_compile"]
    assert sorted(p.name for p in out.glob("checkpoint-*.h5")) == [f"checkpoint-{e}.h5" for e in (1, 2, 3)]


def test_the_elastic_synthetic_benchmark_goes_from_2_to_1_rank_under_launch_local(tmp_path):
    """Under `hvdk8s launch --local` with a discovery script (horovodrun elastic, Gloo on `lo`): the run
    starts on 2 ranks, the discovery script then offers 1 slot, Horovod takes a rank away, the reset
    callback rescales the rate through `opt.lr`, and the benchmark goes on from the committed state. On a
    small convnet, as the synthetic benchmark's test (above)."""
    script = tmp_path / "benchmark.py"
    shutil.copy(RANK_SCRIPTS / "hvd_tf2_elastic_synthetic.py", script)
    shutil.copy(RANK_SCRIPTS / "hvd_tf2_parts.py", tmp_path)  # beside the script, as a user's module would be
    stop = tmp_path / "stop"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "hvd-elastic-benchmark", "framework": "tensorflow",
                                   "entrypoint": {"script": "benchmark.py", "args": [str(tmp_path), "--stop", str(stop),
                                                                           "--model", "convnet"]},
                                   "training": {"elastic": {"min_workers": 1, "max_workers": 2}}}))
    code, out, taken = elastic_launch(job, tmp_path, [
        (r"Iter #1: .*, 2 ranks, lr 0.02\b", lambda hosts: hosts.write_text("localhost:1\n")),
        (r"Iter #\d+: .*, 1 ranks, lr 0.01\b", lambda hosts: stop.write_text(""))])
    assert code == 0, out
    assert taken == 2, f"the benchmark did not go from 2 ranks to 1:\n{out}"
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["size"] == 1 and result["resets"] == [1] and result["lr"] == pytest.approx(0.01), result
    assert re.search(r"Total img/sec on 1 CPU\(s\): [\d.]+", out), out


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory):
    out = tmp_path_factory.mktemp("hvd-tf2-equivalence")
    run_ranks("hvd_tf2_equivalence.py", out)
    return rank_results(out)


def test_distributed_gradient_tape_equals_one_process_on_the_whole_batch(equivalence):
    for r in equivalence:
        tape = r["tape"]
        assert tape["fp32"]["max_abs_diff"] < 1e-6 and tape["predivide"]["max_abs_diff"] < 1e-6, tape
        assert 0 < tape["fp16"]["max_abs_diff"] <= tape["fp16"]["fp16_bound"], tape
        assert tape["sum"]["max_abs_diff"] < 1e-6
        assert tape["sparse"]["kind"] == "IndexedSlices" and tape["sparse"]["max_abs_diff"] < 1e-6
        assert tape["sparse_as_dense"]["kind"] != "IndexedSlices" and tape["sparse_as_dense"]["max_abs_diff"] < 1e-6
        assert tape["local_layer"]["max_abs_diff"] < 1e-7


def test_a_users_tf_function_gets_hvdk8s_and_horovod_code_unconverted(equivalence):
    """Autograph converts what a user's tf.function calls; hvdk8s's functions (DistributedGradientTape, a
    distributed optimizer's apply, broadcast_variables) and the Horovod functions below them run as
    written (they branch on Python values and use tf.cond where a tensor decides, as model.fit runs
    them), which took a third off the CPU of tests/ranks/sharded_tf.py's ranks."""
    for r in equivalence:
        assert r["autograph_converted"] == ["user_step"], r["autograph_converted"]


def test_distributed_optimizer_equals_one_process_on_the_whole_batch(equivalence):
    for r in equivalence:
        opt = r["optimizer"]
        assert opt["fp32"]["max_abs_diff"] < 1e-6, opt
        assert 0 < opt["fp16"]["max_abs_diff"] <= opt["fp16"]["fp16_bound"], opt
        assert opt["accumulated_sum"]["max_abs_diff"] < 1e-6 and opt["accumulated_sum"]["iterations"] == 4, opt
        assert opt["accumulated_mean"]["max_abs_diff"] < 1e-6, opt
        # Adam's bias correction at the k-th update counts 2k micro-batches, as under Horovod.
        assert opt["accumulated_adam"]["max_abs_diff"] < 1e-6 and opt["accumulated_adam"]["iterations"] == 4, opt
        assert opt["fit_none"]["max_abs_diff"] < 1e-6 and not opt["fit_none"]["jit_compile"], opt
        assert opt["fit_none"]["loss"] == pytest.approx(opt["fit_none"]["ref_loss"], rel=1e-5)
        assert opt["fit_fp16"]["max_abs_diff"] < 1e-3, opt
        # mixed_float16: rank 0's overflow skipped the step on both ranks (one of two applied, the scale
        # halved once from 2^15), and the optimizer given to compile is the one that trained
        mixed = opt["fit_mixed_float16"]
        assert mixed["inner_is_yours"] and mixed["iterations"] == 1 and mixed["scale"] == 2.0 ** 14, mixed
        # register_local_var: the registered kernel took this rank's own gradient / size, the rest the average;
        # the optimizer's state is a plain SGD's (nothing of the registration is tracked as a variable).
        assert opt["local_var"]["max_abs_diff"] < 1e-6, opt["local_var"]
        assert opt["local_var"]["variables"][0] == opt["local_var"]["variables"][1], opt["local_var"]
    assert equivalence[0]["optimizer"]["fit_mixed_float16"]["weights"] == \
        equivalence[1]["optimizer"]["fit_mixed_float16"]["weights"]


def test_broadcast_sync_batch_norm_and_value_collectives(equivalence):
    r0, r1 = equivalence
    assert r0["broadcast"]["before"] != r1["broadcast"]["before"]
    assert r0["broadcast"]["after"] == r1["broadcast"]["after"] == r0["broadcast"]["before"]
    for r in equivalence:
        assert r["sync_bn"]["output_diff"] < 1e-5 and r["sync_bn"]["moving_diff"] < 1e-5, r["sync_bn"]
        assert r["values"] == {"allreduce": [1.5, 2.0], "allgather": [0, 1], "broadcast": 11.0}


def test_load_model_distributes_the_saved_optimizer_with_its_state(equivalence):
    for r in equivalence:
        lm = r["load_model"]
        assert lm["plain"] == lm["loaded"] == "Adam" and lm["distributed"] and lm["iterations"] == 2, lm
