"""Hostile and broken job files and `--set` values end in a field error and exit 2, within a second or
two, never a traceback, a hang or a wrong acceptance. Hypothesis generates many of them; the named
cases are the classes a trial against the CLI found."""
from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DIGITS_JOB, cli, cpu_bounded, tally
from hvdk8s.spec import JobFileError, load_job

BASE = DIGITS_JOB.read_text()


def _rejects(path, overrides=(), field: str | None = None) -> JobFileError:
    with cpu_bounded(2.0, path), pytest.raises(JobFileError) as caught:
        load_job(path, list(overrides))
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
    # Kubernetes names and keys the API server refuses, and integers past what it (or the operator) counts
    ("kubernetes.namespace=UPPER", "kubernetes.namespace"), ("kubernetes.namespace=a.b", "kubernetes.namespace"),
    ("kubernetes.namespace=" + "a" * 64, "kubernetes.namespace"), ("kubernetes.queue='bad queue'", "kubernetes.queue"),
    ("kubernetes.scheduling_policy.queue='bad queue'", "kubernetes.scheduling_policy.queue"),
    ("kubernetes.service_account=Bad_SA", "kubernetes.service_account"),
    ("kubernetes.image_pull_secrets=['Bad!']", "kubernetes.image_pull_secrets"),
    ("kubernetes.node_selector={'a b': c}", "kubernetes.node_selector"),
    ("kubernetes.secret_env={TOKEN: {secret: s, key: 'k k'}}", "kubernetes.secret_env.TOKEN.key"),
    (f"kubernetes.run_as_user={2**63}", "kubernetes.run_as_user"),
    (f"resources.workers={2**31}", "resources.workers"),
    (f"resources.ranks_per_worker={2**31}", "resources.ranks_per_worker"),
    (f"kubernetes.ttl_seconds_after_finished={2**31}", "kubernetes.ttl_seconds_after_finished"),
    (f"kubernetes.backoff_limit={2**31}", "kubernetes.backoff_limit"),
    (f"kubernetes.active_deadline_seconds={2**63}", "kubernetes.active_deadline_seconds"),
])
def test_bad_overrides_name_their_field(override, field):
    _rejects(DIGITS_JOB, [override], field)


def test_cli_reports_without_traceback(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"on: 3\n\xff")
    for verb in ("validate", "render", "train"):
        run = cli(verb, path)
        assert run.returncode == 2 and "Traceback" not in run.stderr and str(path) in run.stderr, run.stderr


def test_user_text_in_a_message_is_printed_as_typed_not_as_markup(tmp_path):
    """The CLI's one problem printer draws with rich: a user's text that looks like rich markup (in a
    value or a file name) must come out literally, not styled, swallowed or raising MarkupError."""
    run = cli("validate", DIGITS_JOB, "--set", 'model.name="[bold red]x[/]"')
    assert run.returncode == 2 and "unknown model '[bold red]x[/]'" in run.stderr, run.stderr
    missing = tmp_path / "[bold]nope[/].yaml"
    run = cli("validate", missing)
    assert run.returncode == 2 and f"{missing}: invalid job file" in run.stderr, run.stderr


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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_fields, value=_values, raw=st.text(max_size=30), use_raw=st.booleans())
def test_any_override_is_accepted_or_names_its_field(field, value, raw, use_raw):
    text = raw if use_raw else yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    counts = tally("job files: --set")
    counts["tried"] += 1
    try:
        load_job(DIGITS_JOB, [f"{field}={text}"])
    except JobFileError as e:
        assert e.problems and all(isinstance(p, str) and isinstance(m, str) and m for p, m in e.problems)
        top = field.split(".")[0]
        assert any(p.split(".")[0].split("[")[0] in (top, "") for p, _ in e.problems), (field, text, e.problems)
        counts["refused"] += 1
    else:
        counts["accepted"] += 1


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
        run = cli("render", DIGITS_JOB, "-d", out)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert f"--output-dir {out}: cannot write" in run.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["mpijob.yaml"]  # nothing else, no temporary file


# -- a job that expands past what a ConfigMap holds ------------------------------------------------------------

_TRAINING = "training: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n"
_PAD = '&s "' + "x" * 4096 + '"'
_EXPANDING = {  # 100 aliases of a 4 KiB string: a 0.5 KB file that the ranks receive as 400 KiB
    "model.args": "model: {factory: 'my_pkg.models:build', args: {pad: %s, many: [%s]}}\ndataset: {name: digits}\n",
    "dataset.args": "model: {name: mlp}\ndataset: {factory: 'my_pkg.data:load', args: {pad: %s, many: [%s]}}\n",
    "entrypoint.args": "entrypoint: {script: train.py, args: [%s, %s]}\n",
    "kubernetes.env": "entrypoint: {script: train.py}\nkubernetes: {env: {PAD: %s, %s}}\n",
}


@pytest.mark.parametrize("field", list(_EXPANDING))
def test_a_job_that_expands_past_the_bound_is_refused_at_validate(tmp_path, field):
    from conftest import invoke
    from hvdk8s.jobsize import MAX_JOB_BYTES

    many = ", ".join(f"V{i}: *s" for i in range(100)) if field == "kubernetes.env" else ", ".join(["*s"] * 100)
    path = tmp_path / "job.yaml"
    path.write_text("name: big\nframework: pytorch\n" + _EXPANDING[field] % (_PAD, many) + _TRAINING)
    assert path.stat().st_size < 6000
    (tmp_path / "train.py").write_text("print('hello')\n")
    for verb in (("validate", "--no-import"), ("render", "-d", tmp_path / "out")):
        with cpu_bounded(2.0, verb):
            result = invoke(*verb, path)
        assert result.exit_code == 2, result.output
        assert f"  {field}" in result.stderr and f"larger than {MAX_JOB_BYTES // 1024} KiB" in result.stderr, \
            result.stderr
    assert not (tmp_path / "out").exists()


def test_the_bound_is_on_the_job_as_the_ranks_receive_it():
    """Measured as spec.dump_job writes it: a job of exactly MAX_JOB_BYTES passes, one byte more does not."""
    from hvdk8s import entrypoint, jobsize
    from hvdk8s.spec import dump_job, parse_job

    assert jobsize.MAX_JOB_BYTES + entrypoint.MAX_CARRIED_BYTES <= (1 << 20) - 64 * 1024  # the ConfigMap's room

    data = yaml.safe_load(BASE)
    data["model"] = {"factory": "my_pkg.models:build", "args": {"pad": "x"}}
    spec = parse_job(data)
    assert jobsize.dumped_size(spec) == len(dump_job(spec).encode())
    data["model"]["args"]["pad"] = "x" * (1 + jobsize.MAX_JOB_BYTES - len(dump_job(spec).encode()))
    spec = parse_job(data)
    assert jobsize.dumped_size(spec) == len(dump_job(spec).encode()) == jobsize.MAX_JOB_BYTES
    assert jobsize.problems(spec) == []
    data["model"]["args"]["pad"] += "é"  # two bytes in UTF-8, escaped by the dump
    spec = parse_job(data)
    assert jobsize.dumped_size(spec) is None and [p for p, _ in jobsize.problems(spec)] == ["model.args.pad"]
