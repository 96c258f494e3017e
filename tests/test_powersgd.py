"""PowerSGD gradient compression (training.compression: powersgd): the job file's fields, real Horovod ranks
(tests/ranks/powersgd.py) against plain averaging and against the algorithm written out, and hvdk8s's
trainer end to end, resumed at another rank count."""
from __future__ import annotations

import pytest

from conftest import DIGITS_JOB, cli, events_of, invoke, rank_results, run_ranks

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


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("powersgd")
    run_ranks("powersgd.py", out)
    return rank_results(out)


@pytest.mark.ranks
def test_full_rank_equals_plain_averaging(ranks):
    for r in ranks:
        full = r["full_rank"]
        assert full["compressed"] == 3 and full["moved"] > 0.01  # every weight compressed; the steps trained
        assert full["max_abs_diff"] < 1e-6, full


@pytest.mark.ranks
def test_low_rank_on_2_ranks_equals_the_algorithm_on_the_whole_batch_in_one_process(ranks):
    for r in ranks:
        low = r["low_rank"]
        assert low["max_abs_diff"] < 1e-6, low
        assert low["differs_from_plain"] > 1e-3, low  # rank 2 really compressed


@pytest.mark.ranks
def test_an_fp16_overflow_on_one_rank_skips_the_step_everywhere_and_keeps_the_compression_state(ranks):
    for r in ranks:
        o = r["overflow"]
        assert o["applied"] == [False] and o["params_unchanged"], o
        assert o["state_unchanged"] and o["finite_after"] and o["applied_next"] == [True], o


@pytest.mark.ranks
def test_a_saved_state_holds_the_ranks_mean_error_and_continues_the_run_exactly(ranks):
    for r in ranks:
        resumed = r["resume"]
        assert resumed["steps"] == 4 and resumed["own_errors_differ_from_the_mean"], resumed
        assert resumed["max_abs_diff"] < 1e-6, resumed
        assert resumed["refused"] == ["the checkpoint's PowerSGD rank is 3, this optimizer's 1"]


@pytest.mark.ranks
def test_the_trainer_trains_digits_with_powersgd_and_resumes_at_1_rank(tmp_path):
    """Rank 4 (the default) from step 10: digits keeps 98.6% of the uncompressed accuracy (hvdk8s bench
    --only powersgd_digits); the checkpoint's Q matrices and mean error resume at another rank count."""
    ckpt = tmp_path / "ckpt"
    common = ["--log-format", "json", "--set", "training.compression=powersgd", "--set", f"training.checkpoint.dir={ckpt}"]
    first = cli("launch", "--local", "-np", "2", DIGITS_JOB, *common, "--set", "training.epochs=8")
    assert first.returncode == 0, first.stdout + first.stderr
    [started], [done] = events_of(first.stdout, "start"), events_of(first.stdout, "done")
    assert started["compression"] == "powersgd", started
    assert done["test_accuracy"] >= 0.93, done
    second = cli("launch", "--local", "-np", "1", DIGITS_JOB, *common, "--set", "training.epochs=9")
    assert second.returncode == 0, second.stdout + second.stderr
    assert [(e["path"], e["epoch"]) for e in events_of(second.stdout, "resume")] == \
        [(str(ckpt / "epoch-00008.ckpt"), 8)], second.stdout
    [done] = events_of(second.stdout, "done")
    assert done["test_accuracy"] >= 0.9, done
