"""The command says what it means: one meaning of -o (the output format, as in kubectl), whole sentences in
--help, "did you mean" for a typo, "quote it" for a version YAML reads as a date or a number, how to set a
list, a dataset's version that is not hvdk8s's --version, render's folder without its stale files, the
node's cache by default, and a script's output as it printed it."""
from __future__ import annotations

import re
import shlex

import pytest
import yaml

from conftest import DIGITS_JOB, ROOT, cli, invoke

GOLDEN = ROOT / "tests" / "golden"
OBSERVED_JOB = ROOT / "examples" / "observed.yaml"  # a job with a PodMonitor


def _refused(result, field: str) -> str:
    """The message of an exit 2 naming `field` (its `  field: ...` line), without a traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = next((ln.strip() for ln in result.stderr.splitlines() if ln.strip().startswith(f"{field}:")), None)
    assert line is not None, result.stderr
    return " ".join(result.stderr.split())


# -- -o is the output format; render's and bench's folder is -d/--output-dir -----------------------------

def test_render_writes_into_d_and_the_old_o_still_works_with_a_note(tmp_path):
    new = invoke("render", DIGITS_JOB, "-d", tmp_path / "new")
    assert new.exit_code == 0 and new.stderr == "", new.stderr
    old = invoke("render", DIGITS_JOB, "-o", tmp_path / "old")
    assert old.exit_code == 0 and "-o/--output DIR is now -d/--output-dir DIR" in old.stderr, old.stderr
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == sorted(p.name for p in (tmp_path / "new").iterdir())
    assert all((tmp_path / "old" / p.name).read_text() == p.read_text() for p in (tmp_path / "new").iterdir())
    both = invoke("render", DIGITS_JOB, "-o", tmp_path / "a", "-d", tmp_path / "b")
    assert both.exit_code == 2 and "-o/--output, -d/--output-dir: one folder at a time" in both.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_bench_writes_into_d_and_the_old_o_still_works_with_a_note(tmp_path):
    job = GOLDEN / "gpu-4x8-rdma" / "job.yaml"
    new = invoke("bench", "--render", job, "-d", tmp_path / "new")
    assert new.exit_code == 0 and new.stderr == "", new.stderr
    old = invoke("bench", "--render", job, "-o", tmp_path / "old")
    assert old.exit_code == 0 and "-o/--output DIR is now -d/--output-dir DIR" in old.stderr, old.stderr
    assert [p.relative_to(tmp_path / "new") for p in sorted((tmp_path / "new").rglob("*"))] == \
        [p.relative_to(tmp_path / "old") for p in sorted((tmp_path / "old").rglob("*"))]
    assert "-d \"$out\"" in (ROOT / ".ci" / "run").read_text()  # CI's smoke run spells it the new way
    for verb in ("render", "bench"):
        shown = invoke(verb, "--help").stdout
        assert "-d, --output-dir DIR" in shown and not re.search(r"\s-o,|--output\s", shown), shown


# -- --help ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("group", [(), ("cache",)])
def test_each_verb_is_summed_up_in_a_whole_sentence(group):
    shown = invoke(*group, "--help").stdout
    rows = shown.split("Commands:\n", 1)[1].splitlines()
    assert len(rows) >= 5 and all(re.match(r"^  \S+ +\S", row) for row in rows), shown  # one line each
    for row in rows:
        summary = row.split(None, 1)[1]
        assert summary.endswith(".") and not summary.endswith("...") and summary[0].isupper(), row


def test_n_names_a_job_file_only_where_there_is_one():
    for verb in ("status", "logs", "wait", "list", "delete"):
        shown = " ".join(invoke(verb, "--help").stdout.split())
        namespace = re.search(r"-n, --namespace TEXT (.*?\.)", shown).group(1)
        assert "job file" not in namespace and "the context's" in namespace, (verb, namespace)
    shown = " ".join(invoke("launch", "--help").stdout.split())
    assert "Namespace (default: the job file's kubernetes.namespace, else the context's)." in shown


# -- "did you mean" instead of every name ---------------------------------------------------------------

@pytest.mark.parametrize("override,field,meant", [
    ("training.epoch=3", "training.epoch", "unknown field; did you mean epochs?"),
    ("trainig.epochs=3", "trainig", "unknown field; did you mean training?"),
    ("kubernetes.namspace=x", "kubernetes.namspace", "unknown field; did you mean namespace?"),
    ("training.optimizer=adamm", "training.optimizer", "'adamm' is not a choice here; did you mean 'adam'?"),
    ("kubernetes.image_pull_policy=always", "kubernetes.image_pull_policy", "did you mean 'Always'?"),
    ("model.name=resnt", "model.name", "unknown model 'resnt'; did you mean resnet?"),
    ("dataset.name=digit", "dataset.name", "unknown dataset 'digit'; did you mean digits?"),
])
def test_a_typo_in_a_field_or_a_choice_gets_did_you_mean(override, field, meant):
    said = _refused(invoke("validate", "--no-import", DIGITS_JOB, "--set", override), field)
    assert meant in said and "allowed here" not in said, said


def test_a_name_like_none_allowed_still_lists_them():
    said = _refused(invoke("validate", "--no-import", DIGITS_JOB, "--set", "training.zzz=1"), "training.zzz")
    assert "unknown field; allowed here: epochs, batch_size" in said, said


def test_typos_in_verbs_options_and_option_values_get_did_you_mean():
    verb = invoke("lanch", DIGITS_JOB)
    assert verb.exit_code == 2 and "launch" in verb.stderr and "Did you mean" in verb.stderr, verb.stderr
    option = invoke("render", DIGITS_JOB, "--outptu-dir", "x")
    assert option.exit_code == 2 and "Did you mean '--output-dir'?" in option.stderr, option.stderr
    choice = invoke("status", "job", "-o", "yml")
    assert choice.exit_code == 2 and "did you mean 'yaml'?" in choice.stderr, choice.stderr
    log_format = invoke("launch", "--local", DIGITS_JOB, "--log-format", "jsn")
    assert log_format.exit_code == 2 and "did you mean 'json'?" in log_format.stderr, log_format.stderr
    bench = invoke("bench", "--only", "wraper")
    assert bench.exit_code == 2 and "unknown benchmark wraper (did you mean wrapper?)" in bench.stderr
    assert "tf_input" not in bench.stderr, bench.stderr


# -- YAML's dates and numbers where text belongs ---------------------------------------------------------

@pytest.mark.parametrize("written,read_as", [("2025-01-15", "as a date"), ("1.10", "as the number 1.1")])
def test_an_unquoted_version_is_refused_with_quote_it(tmp_path, written, read_as):
    job = tmp_path / "job.yaml"
    text = DIGITS_JOB.read_text().replace("  test_fraction: 0.2\n", f"  test_fraction: 0.2\n  version: {written}\n")
    job.write_text(text)
    said = _refused(invoke("validate", "--no-import", job), "dataset.version")
    assert read_as in said and "quote it" in said, said
    job.write_text(text.replace(f"version: {written}", f'version: "{written}"'))
    assert invoke("validate", "--no-import", job).exit_code == 0
    assert invoke("validate", "--no-import", "--print", job).stdout.count(f"version: '{written}'") == 1


# -- --set ----------------------------------------------------------------------------------------------

def test_an_item_of_a_list_cannot_be_set_and_the_message_says_how_to_set_the_list(tmp_path):
    job = GOLDEN / "gpu-1x8" / "job.yaml"  # kubernetes.volumes: [{name: ckpt, mount_path: /ckpt, pvc: ...}]
    said = _refused(invoke("render", job, "--set", "kubernetes.volumes[0].pvc=x"), "kubernetes.volumes[0].pvc")
    assert "a list is set whole" in said, said
    advice = re.search(r"--set ('kubernetes\.volumes=\[.*?\]')", said).group(1)
    assert advice == "'kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: x}]'", said
    followed = invoke("render", job, "--set", shlex.split(advice)[0], "-d", tmp_path)  # the advice, as typed
    assert followed.exit_code == 0, followed.stderr
    mpijob = yaml.safe_load((tmp_path / "mpijob.yaml").read_text())
    volumes = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    assert {"name": "ckpt", "persistentVolumeClaim": {"claimName": "x"}} in volumes, volumes
    # Without such an item in the job file, the advice shows the form.
    said = _refused(invoke("validate", "--no-import", DIGITS_JOB, "--set", "kubernetes.volumes[0].pvc=x"),
                    "kubernetes.volumes[0].pvc")
    assert "--set 'kubernetes.volumes=[...]'" in said, said


def test_set_without_equals_says_so():
    said = _refused(invoke("validate", "--no-import", DIGITS_JOB, "--set", "training.epochs"), "training.epochs")
    assert "--set training.epochs has no '=': write --set training.epochs=VALUE" in said, said


# -- cache ----------------------------------------------------------------------------------------------

def test_a_datasets_version_is_dataset_version_and_cache_ls_shows_it_from_the_nodes_cache(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "node-cache"
    src.mkdir()
    (src / "a.bin").write_bytes(b"abc")
    old = invoke("cache", "sync", src, cache, "--version", "2025-01")
    assert old.exit_code == 2 and "--dataset-version 2025-01" in old.stderr and not cache.exists(), old.stderr
    assert invoke("--version").stdout.startswith("hvdk8s, version ")
    synced = invoke("cache", "sync", src, cache, "--dataset-version", "2025-01")
    assert synced.exit_code == 0, synced.stderr
    listed = invoke("cache", "ls", env={"HVDK8S_CACHE_DIR": str(cache)})  # no DST: the node's cache
    assert listed.exit_code == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:3] == ["key", "source", "version"] and row.split()[1:3] == [str(src), "2025-01"], listed.stdout
    assert invoke("cache", "ls", cache).stdout == listed.stdout
    assert "no datasets in" in invoke("cache", "ls", env={"HVDK8S_CACHE_DIR": str(tmp_path / "empty")}).stdout


# -- render's folder ------------------------------------------------------------------------------------

def test_render_removes_the_podmonitor_it_wrote_once_the_job_has_none(tmp_path):
    out = tmp_path / "deploy"
    assert invoke("render", OBSERVED_JOB, "-d", out).exit_code == 0
    (out / "notes.md").write_text("the user's own file")
    assert (out / "podmonitor.yaml").is_file()
    off = invoke("render", OBSERVED_JOB, "--set", "observability.metrics.pod_monitor=false", "-d", out)
    assert off.exit_code == 0, off.stderr
    assert sorted(p.name for p in out.iterdir()) == ["configmap.yaml", "kustomization.yaml", "mpijob.yaml", "notes.md"]
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"] == ["configmap.yaml", "mpijob.yaml"]
    # A podmonitor.yaml that render did not write is the user's: it stays.
    own = "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: mine}\n"
    (out / "podmonitor.yaml").write_text(own)
    assert invoke("render", DIGITS_JOB, "-d", out).exit_code == 0
    assert (out / "podmonitor.yaml").read_text() == own and (out / "notes.md").is_file()


# -- a script's output ----------------------------------------------------------------------------------

@pytest.mark.ranks
def test_a_scripts_output_is_shown_without_mpiruns_rank_tags(tmp_path):
    (tmp_path / "hello.py").write_text("import os, sys\nrank = os.environ['OMPI_COMM_WORLD_RANK']\n"
                                       "print(f'hello from rank {rank}')\nprint(f'warning on rank {rank}', file=sys.stderr)\n")
    (tmp_path / "job.yaml").write_text("name: hello\nframework: pytorch\nentrypoint: {script: hello.py}\n"
                                       "training: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n")
    run = cli("launch", "--local", "-np", "2", tmp_path / "job.yaml", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "hello from rank 0" in lines and "warning on rank 0" in lines, run.stdout
    assert "[rank 1] hello from rank 1" in lines and "[rank 1] warning on rank 1" in lines, run.stdout
    assert "<stdout>" not in run.stdout and "<stderr>" not in run.stdout, run.stdout
