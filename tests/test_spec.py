"""Job files: valid ones load, bad ones exit 2 through the real CLI naming the field, no traceback."""
import textwrap

import pytest
import yaml

from conftest import DIGITS_JOB, cli
from hvdk8s.spec import JobFileError, apply_overrides, load_job, parse_job


def digits_data():
    return yaml.safe_load(DIGITS_JOB.read_text())


def test_example_job_is_valid():
    spec = load_job(DIGITS_JOB)
    assert (spec.framework, spec.model.name, spec.dataset.name) == ("pytorch", "mlp", "digits")
    assert spec.training.compression == "auto"
    proc = cli("validate", DIGITS_JOB)
    assert proc.returncode == 0 and "valid" in proc.stdout


def test_print_fills_defaults_and_round_trips():
    proc = cli("validate", "--print", DIGITS_JOB)
    assert proc.returncode == 0
    printed = yaml.safe_load(proc.stdout)
    assert printed["training"]["backward_passes_per_step"] == 1
    assert parse_job(printed) == load_job(DIGITS_JOB)


def test_overrides_change_fields_and_are_validated():
    spec = load_job(DIGITS_JOB, ["training.epochs=3", "model.args.hidden=[8]"])
    assert spec.training.epochs == 3 and spec.model.args["hidden"] == [8]
    with pytest.raises(JobFileError) as e:
        load_job(DIGITS_JOB, ["training.epochs=-1"])
    assert e.value.problems[0][0] == "training.epochs"
    with pytest.raises(JobFileError):
        apply_overrides({}, ["no-equals-sign"], "x")


def mutate(data, path, value):
    node = data
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()

BAD = [
    # (what, field path, value, field named in the error, words in the message)
    ("unknown key", "training.batchsize", 32, "training.batchsize", "unknown field; did you mean batch_size?"),
    ("unknown key like none", "training.nodes", 2, "training.nodes", "unknown field; allowed here: epochs"),
    ("unknown top-level key", "nodes", 3, "nodes", "unknown field"),
    ("wrong type", "training.epochs", "ten", "training.epochs", "valid integer"),
    ("negative batch size", "training.batch_size", -8, "training.batch_size", "greater than 0"),
    ("zero learning rate", "training.learning_rate", 0, "training.learning_rate", "greater than 0"),
    ("unknown model", "model.name", "vgg", "model.name", "unknown model 'vgg'; registered models: cnn, mlp"),
    ("unknown model argument", "model.args.width", 3, "model.args.width", "unknown field; allowed here: hidden"),
    ("bad model argument", "model.args.hidden", "wide", "model.args.hidden", "valid list"),
    ("unknown framework", "framework", "jax", "framework", "'pytorch' or 'tensorflow'"),
    ("bad compression", "training.compression", "int8", "training.compression", "'auto', 'fp16', 'none' or 'powersgd'"),
    ("missing field", "training.epochs", DELETE, "training.epochs", "required field is missing"),
    ("bad name", "name", "Digits_MLP", "name", "lower-case"),
    ("bad quantity", "resources.memory", "16GB", "resources.memory", "Kubernetes quantity"),
    ("unknown dataset", "dataset.name", "imagenet", "dataset.name", "unknown dataset 'imagenet'"),
    ("model for another task", "model.name", "transformer", "dataset.name", "language model"),
    ("cache for a built-in dataset", "dataset.cache", True, "dataset", "`cache` applies to `path` datasets"),
]


@pytest.mark.parametrize("dataset,words", [
    ({"path": "ftp://host/data"}, "scheme 'ftp' is not supported"),
    ({"path": "s3://bucket/data", "cache": False}, "read from the node-local cache"),
    ({"path": "s3://bucket/data", "s3": {"endpoint": "x"}}, "unknown field"),
])
def test_bad_dataset_sources(dataset, words):
    data = digits_data()
    data["dataset"] = dataset
    with pytest.raises(JobFileError) as e:
        parse_job(data)
    assert words in str(e.value)


def test_remote_sources_are_cached_and_local_ones_on_request():
    data = digits_data()
    for path, cache, cached in [("s3://b/p", None, True), ("https://h/p/hvdk8s-manifest.json", None, True),
                                ("/nfs/data", None, False), ("/nfs/data", True, True)]:
        data["dataset"] = {"path": path, **({"cache": cache} if cache is not None else {})}
        assert parse_job(data).dataset.cached is cached


@pytest.mark.parametrize("what,path,value,field,words", BAD, ids=[b[0] for b in BAD])
def test_bad_job_file_exits_2_naming_the_field(tmp_path, what, path, value, field, words):
    job = tmp_path / "bad.yaml"
    job.write_text(yaml.safe_dump(mutate(digits_data(), path, value)))
    proc = cli("validate", job)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(job) in proc.stderr
    line = next((ln for ln in proc.stderr.splitlines() if ln.strip().startswith(field + ":")), None)
    assert line is not None, f"no line for {field}:\n{proc.stderr}"
    assert words in " ".join(proc.stderr.split()), proc.stderr


def test_all_problems_are_reported_at_once():
    data = mutate(mutate(digits_data(), "training.batch_size", 0), "model.name", "vgg")
    with pytest.raises(JobFileError) as e:
        parse_job(data)
    assert {p for p, _ in e.value.problems} == {"training.batch_size", "model.name"}


@pytest.mark.parametrize("text,words", [
    ("name: [unclosed", "not valid YAML: line 1"),
    ("- a\n- b\n", "expected a mapping"),
    ("name: a\n---\nname: b\n", "exactly one YAML document"),
    ("", "exactly one YAML document"),
])
def test_unreadable_files_exit_2(tmp_path, text, words):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    proc = cli("validate", job)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr


def test_missing_file_exits_2(tmp_path):
    proc = cli("validate", tmp_path / "nope.yaml")
    assert proc.returncode == 2 and "file not found" in proc.stderr


def test_dataset_needs_exactly_one_source():
    data = digits_data()
    data["dataset"] = {"name": "digits", "path": "/data/x"}
    with pytest.raises(JobFileError) as e:
        parse_job(data)
    assert e.value.problems[0][0] == "dataset"
    assert "exactly one of `name`" in e.value.problems[0][1]


def test_resnet_depth_must_be_6n_plus_2():
    data = digits_data()
    data["model"] = {"name": "resnet", "args": {"depth": 21}}
    with pytest.raises(JobFileError) as e:
        parse_job(data)
    assert e.value.problems == [("model.args.depth", "depth must be 6n+2 (8, 14, 20, 32, 44, 56, 110, ...), got 21")]


def test_launch_refuses_a_bad_file_before_starting_ranks(tmp_path):
    job = tmp_path / "bad.yaml"
    job.write_text(textwrap.dedent("""\
        name: x
        framework: pytorch
        model: {name: mlp}
        dataset: {name: digits}
        training: {epochs: 1, batch_size: -1, learning_rate: 0.1}
    """))
    proc = cli("launch", "--local", "-np", "2", job)
    assert proc.returncode == 2 and "training.batch_size" in proc.stderr
    assert "horovodrun" not in proc.stdout + proc.stderr
