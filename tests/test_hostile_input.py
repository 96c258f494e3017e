"""Hostile and broken job files and `--set` values end in a field error and exit 2, within a second or
two, never a traceback, a hang or a wrong acceptance. Hypothesis generates many of them; the named
cases are the classes a trial against the CLI found."""
from __future__ import annotations

import os
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DIGITS_JOB, cli
from hvdk8s.spec import JobFileError, load_job

BASE = DIGITS_JOB.read_text()


def _rejects(path, overrides=(), field: str | None = None) -> JobFileError:
    began = time.perf_counter()
    with pytest.raises(JobFileError) as caught:
        load_job(path, list(overrides))
    assert time.perf_counter() - began < 2.0
    if field is not None:
        assert any(p == field or p.startswith(field) for p, _ in caught.value.problems), caught.value
    return caught.value


@pytest.mark.parametrize("text,what", [
    ("on: 3\n" + BASE, "is not a string"),
    ("1: 2\n" + BASE, "is not a string"),
    ("~: 2\n" + BASE, "is not a string"),
    (BASE + "training: {epochs: 1}\n", "duplicate key 'training'"),
    ("a: " + "[" * 500 + "]" * 500 + "\n", "nested"),
    ("a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 10) + "]\n"
                                                for p, c in zip("abcdefghi", "bcdefghij")), "aliases are expanded"),
    ("# comment\n" * 150_000, "larger than"),
    ("image: " + "x" * 2_000_000 + "\n", "larger than"),
])
def test_hostile_yaml_is_refused_quickly(tmp_path, text, what):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert what in str(_rejects(path))


@pytest.mark.parametrize("data", [b"\xff\xfe" + "name: x\n".encode("utf-16-le"), "name: caf\xe9\n".encode("latin-1")])
def test_non_utf8_files_are_refused(tmp_path, data):
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    assert "not UTF-8" in str(_rejects(path))


def test_unbounded_files_are_read_only_up_to_the_limit():
    assert "larger than" in str(_rejects("/dev/zero")) or "not UTF-8" in str(_rejects("/dev/zero"))
    assert "file not found" in str(_rejects("/nonexistent/job.yaml"))
    assert "is a directory" in str(_rejects("/tmp"))


@pytest.mark.parametrize("override,field", [
    ("training.epochs=[1", "training.epochs"), ("name=@x", "name"), ("name=a: b: c", "name"),
    ("name=a\x00b", "name"), ("training.warmup_epochs=.inf", "training.warmup_epochs"),
    ("training.learning_rate=.inf", "training.learning_rate"), ("training.seed=18446744073709551616", "training.seed"),
    ("model.args.hidden=[0]", "model.args.hidden"), ("training.clip_grad_norm=.nan", "training.clip_grad_norm"),
    ("training.precision=fp8", "training.precision"), ("training", "training"),
])
def test_bad_overrides_name_their_field(override, field):
    _rejects(DIGITS_JOB, [override], field)


def test_cli_reports_without_traceback(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"on: 3\n\xff")
    for verb in ("validate", "render", "train"):
        run = cli(verb, path)
        assert run.returncode == 2 and "Traceback" not in run.stderr and str(path) in run.stderr, run.stderr


# A YAML value anywhere in the job: scalars of every type, lists and maps, and text that is not YAML.
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
_fields = st.sampled_from([
    "name", "framework", "model.name", "model.args", "model.args.hidden", "model.factory", "dataset.name",
    "dataset.path", "dataset.args", "dataset.test_fraction", "training.epochs", "training.batch_size",
    "training.optimizer", "training.learning_rate", "training.precision", "training.clip_grad_norm",
    "training.checkpoint", "training.checkpoint.keep", "entrypoint", "entrypoint.script", "entrypoint.args",
    "resources.cpu", "resources.memory", "resources.gpus", "kubernetes.env", "image", "unknown.field"])


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_fields, value=_values, raw=st.text(max_size=30), use_raw=st.booleans())
def test_any_override_is_accepted_or_names_its_field(field, value, raw, use_raw):
    text = raw if use_raw else yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    try:
        load_job(DIGITS_JOB, [f"{field}={text}"])
    except JobFileError as e:
        assert e.problems and all(isinstance(p, str) and isinstance(m, str) and m for p, m in e.problems)
        top = field.split(".")[0]
        assert any(p.split(".")[0].split("[")[0] in (top, "") for p, _ in e.problems), (field, text, e.problems)


def test_render_into_a_bad_destination_names_it_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    taken = tmp_path / "taken"
    (taken / "mpijob.yaml").mkdir(parents=True)  # a directory where a rendered file belongs
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o555)
    cases = [blocker / "out", taken]
    if os.geteuid() != 0:  # root writes through 0555
        cases.append(readonly)
    for out in cases:
        run = cli("render", DIGITS_JOB, "-o", out)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert f"-o {out}: cannot write" in run.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["mpijob.yaml"]  # nothing else, no temporary file
