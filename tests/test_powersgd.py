"""PowerSGD gradient compression (training.compression: powersgd), both frameworks: the job file's fields,
real Horovod ranks (tests/ranks/powersgd.py, powersgd_tf.py: the steps traced as model.fit traces them)
against plain averaging and against the algorithm written out. The TensorFlow instances run in the
TensorFlow rank stream (their ids name it). The trainer end to end with PowerSGD, elastic and resumed at
another rank count: tests/test_elastic.py."""
from __future__ import annotations

import pytest

from conftest import DIGITS_JOB, invoke, rank_results, run_ranks

pytestmark = pytest.mark.after_the_node  # its rank tests: the third rank stream (tests/workgroups.py)


@pytest.mark.parametrize("sets, says", [
    (["training.powersgd={rank: 2}"], "training.powersgd: applies only with training.compression: powersgd"),
    (["training.compression=powersgd", "training.shard_optimizer_state=1"],
     "training.compression: powersgd and training.shard_optimizer_state: one or the other"),
    (["training.compression=powersgd", "training.powersgd={rank: 0}"],
     "training.powersgd.rank: Input should be greater than or equal to 1"),
    (["training.compression=powersgd", "training.powersgd={rnak: 2}"], "training.powersgd.rnak"),
])
def test_bad_powersgd_settings_are_named_with_exit_2(sets, says):
    run = invoke("validate", DIGITS_JOB, *[a for s in sets for a in ("--set", s)])
    assert run.exit_code == 2 and says in run.stderr, run.stderr


def test_powersgd_settings_are_printed_with_their_defaults():
    run = invoke("validate", DIGITS_JOB, "--set", "training.compression=powersgd", "--set",
                 "training.powersgd={rank: 2}", "--print")
    assert run.exit_code == 0, run.stderr
    assert "compression: powersgd" in run.stdout and "rank: 2" in run.stdout and "start_step: 10" in run.stdout


SCRIPTS = {"pytorch": "powersgd.py", "tensorflow": "powersgd_tf.py"}


@pytest.fixture(scope="module", params=list(SCRIPTS))
def ranks(request, tmp_path_factory):
    """(framework, each rank's results): tests/ranks/powersgd.py or powersgd_tf.py on 2 real ranks."""
    out = tmp_path_factory.mktemp(f"powersgd-{request.param}")
    run_ranks(SCRIPTS[request.param], out)
    return request.param, rank_results(out)


@pytest.mark.ranks
def test_full_rank_equals_plain_averaging(ranks):
    for r in ranks[1]:
        full = r["full_rank"]
        assert full["compressed"] == 3 and full["moved"] > 0.01  # every weight compressed; the steps trained
        assert full["max_abs_diff"] < 1e-6, full


@pytest.mark.ranks
def test_low_rank_on_2_ranks_equals_the_algorithm_on_the_whole_batch_in_one_process(ranks):
    for r in ranks[1]:
        low = r["low_rank"]
        assert low["max_abs_diff"] < 1e-6, low
        assert low["differs_from_plain"] > 1e-3, low  # rank 1 or 2 really compressed


@pytest.mark.ranks
def test_an_fp16_overflow_on_one_rank_skips_the_step_everywhere_and_keeps_the_compression_state(ranks):
    for r in ranks[1]:
        o = r["overflow"]
        assert o["applied"] == [False] and o["params_unchanged"], o
        assert o["state_unchanged"] and o["finite_after"] and o["applied_next"] == [True], o


@pytest.mark.ranks
def test_a_saved_state_holds_the_ranks_mean_error_and_continues_the_run_exactly(ranks):
    framework, results = ranks
    for r in results:
        resumed = r["resume"]
        assert resumed["steps"] == 4 and resumed["own_errors_differ_from_the_mean"], resumed
        assert resumed["max_abs_diff"] < 1e-6, resumed
        if framework == "pytorch":  # a state of another rank is refused by name ...
            assert resumed["refused"] == ["the checkpoint's PowerSGD rank is 3, this optimizer's 1"]
        else:  # ... or, as any checkpoint that does not fit the optimizer's variables, skipped
            assert resumed["epoch"] == 4 and not resumed["other_rank_loaded"], resumed
