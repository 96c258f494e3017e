"""Users' own code in a job: an entrypoint script (run locally on real ranks, rendered for a cluster),
model and dataset factories by import path, and the errors a wrong path or result gives."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import OPERATOR_CRD, ROOT, cli, events_of, invoke

EXAMPLES = ROOT / "examples"
USER_CODE = Path(__file__).resolve().parent / "user_code"


def _accuracy(out: str) -> float:
    """What the example script logs last (hvdk8s.torch.log: its own line, not an event)."""
    return float(re.findall(r"test accuracy ([\d.]+)%", out)[-1])


@pytest.mark.ranks
def test_own_script_trains_checkpoints_resumes_and_renders(tmp_path):
    job = EXAMPLES / "script" / "job.yaml"
    ckpt = tmp_path / "ckpt"
    first = cli("launch", "--local", "-np", "2", job, "--set", "training.epochs=8",
                "--set", f"training.checkpoint.dir={ckpt}")
    assert first.returncode == 0, first.stdout + first.stderr
    assert _accuracy(first.stdout) >= 93.0, first.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-00006.ckpt", "epoch-00007.ckpt", "epoch-00008.ckpt"]

    resumed = cli("launch", "--local", "-np", "1", job, "--set", "training.epochs=10",  # another rank count
                  "--set", f"training.checkpoint.dir={ckpt}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {ckpt / 'epoch-00008.ckpt'} at epoch 8" in resumed.stdout
    assert _accuracy(resumed.stdout) >= 93.0 and "after 10 epochs" in resumed.stdout

    out = tmp_path / "rendered"
    # On a cluster checkpoints must land on a volume that outlives the pods (render refuses otherwise).
    rendered = invoke("render", job, "-d", out, "--set", "training.checkpoint.dir=/ckpt/own-script",
                      "--set", "kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, pvc: own-script-ckpt}]")
    assert rendered.exit_code == 0, rendered.stderr
    configmap = yaml.safe_load((out / "configmap.yaml").read_text())
    assert configmap["data"]["train.py"] == (EXAMPLES / "script" / "train.py").read_text()
    mpijob = yaml.safe_load((out / "mpijob.yaml").read_text())
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][-7:] == ["python", "-m", "hvdk8s.rankmain", "--script", "/etc/hvdk8s/train.py",
                                       "--hidden", "64"]
    assert "HVDK8S_JOB" in launcher["command"]  # forwarded to every rank: hvdk8s.job() finds the job
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {"name": "job", "mountPath": "/etc/hvdk8s", "readOnly": True} in worker["containers"][0]["volumeMounts"]
    checked = invoke("validate", out / "mpijob.yaml")
    assert checked.exit_code == 0, checked.stderr
    if OPERATOR_CRD.exists():  # built or in ../shared on every machine here and in CI
        checked = invoke("validate", out / "mpijob.yaml", "--crd", OPERATOR_CRD)
        assert checked.exit_code == 0, checked.stderr


@pytest.mark.ranks
@pytest.mark.parametrize("framework,model", [("tensorflow", "my_pkg.models:keras_mlp")])
def test_model_and_dataset_factories_train(framework, model):
    """The factories example under TensorFlow, its model factory changed as the job file's comment says
    (under PyTorch, as it is, the README's launch of it: test_readme.py)."""
    run = cli("launch", "--local", "-np", "2", "--log-format", "json", EXAMPLES / "factories" / "job.yaml",
              "--set", f"framework={framework}", "--set", f"model.factory={model}")
    assert run.returncode == 0, run.stdout + run.stderr
    [started], [done] = events_of(run.stdout, "start"), events_of(run.stdout, "done")
    assert (started["framework"], started["model"], started["dataset"]) == \
        (framework, model, "my_pkg.data:noisy_digits")
    assert done["test_accuracy"] >= 0.93, run.stdout


@pytest.fixture
def user_dir(tmp_path):
    """A user's folder: the example package, the broken factories, and a job file to vary."""
    shutil.copytree(EXAMPLES / "factories" / "my_pkg", tmp_path / "my_pkg")
    for name in ("bad_factories.py", "broken_module.py"):
        shutil.copy(USER_CODE / name, tmp_path / name)
    shutil.copy(EXAMPLES / "factories" / "job.yaml", tmp_path / "job.yaml")
    return tmp_path


BAD_FACTORIES = [
    ("model.factory", "no_such_pkg.models:build", "no module named 'no_such_pkg'"),
    ("model.factory", "my_pkg.models:no_such_model", "has no attribute 'no_such_model'"),
    ("model.factory", "bad_factories:NOT_CALLABLE", "is a int, not a function or class"),
    ("model.factory", "broken_module:build", "importing 'broken_module' failed: SyntaxError"),
    ("model.factory", "bad_factories:raises", "RuntimeError: the user's factory broke"),
    ("model.factory", "bad_factories:not_a_model", "returned str, not a torch.nn.Module"),
    ("dataset.factory", "bad_factories:not_a_dataset", "returned an unusable dataset: got int"),
    ("dataset.factory", "bad_factories:empty_dataset", "returned an unusable dataset: the dataset is empty"),
    ("dataset.factory", "bad_factories:bad_split", "needs exactly the keys 'train' and 'test'"),
    ("model.factory", "my_pkg.models.torch_mlp", "is not an import path"),
    # a map-style dataset with no `classes`/`targets`: its samples do not say how many classes there are
    ("dataset.factory", "good_factories:unlabelled_rows", None),
]


@pytest.mark.parametrize("field,path,message", BAD_FACTORIES, ids=[b[1] for b in BAD_FACTORIES])
def test_bad_factory_is_a_field_error_at_validate(user_dir, field, path, message):
    shutil.copy(USER_CODE / "good_factories.py", user_dir / "good_factories.py")
    run = cli("validate", user_dir / "job.yaml", "--set", f"{field}={path}", "--set", "dataset.args={}")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    if message is None:  # the dataset loads; the model it feeds lacks a fact it needs
        field, message = "model.factory", "needs num_classes, which the dataset does not tell"
    assert f"{field}:" in run.stderr and message in run.stderr, run.stderr


GOOD_DATASETS = {"good_factories:arrays": (48, 12), "good_factories:protocol": (48, 12),
                 "good_factories:own_split": (40, 20)}


@pytest.mark.parametrize("path", GOOD_DATASETS)
def test_every_kind_of_dataset_result_validates(user_dir, path):
    shutil.copy(USER_CODE / "good_factories.py", user_dir / "good_factories.py")
    run = cli("validate", user_dir / "job.yaml", "--set", f"dataset.factory={path}", "--set", "dataset.args={}")
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("path", GOOD_DATASETS)
def test_every_kind_of_dataset_result_is_read_whole_by_the_sharded_loaders(monkeypatch, path):
    """Arrays, a user's protocol object and a map-style dataset (with its own split) reach the
    PyTorch and TensorFlow loaders: two ranks together read each training sample once per epoch."""
    import numpy as np

    from hvdk8s.data.tensorflow import sharded_dataset
    from hvdk8s.factories import dataset_splits
    from hvdk8s.data.torch import ShardedLoader
    from hvdk8s.spec import DatasetSpec

    monkeypatch.syspath_prepend(str(USER_CODE))
    splits = dataset_splits(DatasetSpec(factory=path, test_fraction=0.2))
    assert (len(splits["train"]), len(splits["test"])) == GOOD_DATASETS[path]
    assert splits["train"].info == {"input_shape": [5], "num_classes": 3}
    whole = splits["train"].take(np.arange(len(splits["train"])))
    expected = sorted(map(tuple, np.column_stack([whole[0], whole[1]]).tolist()))

    def rows(batches):  # torch's Batch and tf.data's (x, y) alike: the first two parts of each
        return [tuple(r) for b in batches for r in np.column_stack([np.asarray(b[0]), np.asarray(b[1])]).tolist()]

    torch_rows = [row for rank in (0, 1) for row in rows(ShardedLoader(splits["train"], 8, rank=rank, size=2))]
    tf_rows = [row for rank in (0, 1) for row in rows(sharded_dataset(splits["train"], 8, rank=rank, size=2))]
    assert sorted(torch_rows) == expected and sorted(tf_rows) == expected


def test_bad_factory_stops_a_launch_before_any_rank_starts(user_dir):
    run = cli("launch", "--local", "-np", "2", user_dir / "job.yaml", "--set", "model.factory=bad_factories:raises")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "model.factory:" in run.stderr and "[1,0]" not in run.stdout + run.stderr


def test_validate_no_import_checks_only_the_file(user_dir):
    run = cli("validate", user_dir / "job.yaml", "--no-import", "--set", "model.factory=no_such_pkg.x:build")
    assert run.returncode == 0, run.stderr


@pytest.mark.ranks
def test_ranks_receive_the_validated_job_not_the_file(tmp_path):
    shutil.copy(USER_CODE / "print_job.py", tmp_path / "print_job.py")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "print-job", "framework": "pytorch",
                                   "entrypoint": {"script": "print_job.py", "args": ["--flag", 3]},
                                   "training": {"epochs": 2, "batch_size": 8, "learning_rate": 0.1}}))
    run = cli("launch", "--local", "-np", "2", job, "--set", "training.epochs=7")
    assert run.returncode == 0, run.stdout + run.stderr
    decoder = json.JSONDecoder()  # each JSON value after a marker: mpirun may put two ranks' writes on a line
    seen = [decoder.raw_decode(run.stdout, m.end())[0] for m in re.finditer(r"JOB (?=\{)", run.stdout)]
    assert sorted(s["rank"] for s in seen) == ["0", "1"]
    for s in seen:  # the override and the defaults, from a file the launcher wrote, not the user's
        assert (s["epochs"], s["precision"], s["momentum"], s["argv"]) == (7, "fp32", 0.9, ["--flag", "3"])
        assert Path(s["file"]) != job and not Path(s["file"]).exists()  # removed after the run


ENTRYPOINT_ERRORS = [
    ({"script": "missing.py"}, "entrypoint.script", "does not exist"),
    ({"script": "a.py", "module": "b"}, "entrypoint", "exactly one of `script`"),
    ({"module": "my_pkg.train", "code": "configmap"}, "entrypoint", "must be installed in the image"),
    ({"module": "not a module"}, "entrypoint.module", "is not a module name"),
    ({"script": "my script.py"}, "entrypoint", "becomes a key of the job's ConfigMap"),
    ({"script": "t.py", "args": [True]}, "entrypoint.args", "quote true/false"),
]


@pytest.mark.parametrize("entrypoint,field,message", ENTRYPOINT_ERRORS, ids=[e[2] for e in ENTRYPOINT_ERRORS])
def test_entrypoint_errors_name_the_field(tmp_path, entrypoint, field, message):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "bad", "framework": "pytorch", "entrypoint": entrypoint,
                                   "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}))
    for verb in ("validate", "render"):
        run = cli(verb, job)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert f"{field}:" in run.stderr and message in run.stderr, run.stderr


@pytest.mark.parametrize("content,message", [
    (b"#" * (600 * 1024), "a ConfigMap carries at most"),
    ("print('caf\xe9')\n".encode("latin-1"), "is not UTF-8 text"),
], ids=["too-large", "not-utf8"])
def test_a_script_the_configmap_cannot_carry_is_refused_at_render(tmp_path, content, message):
    (tmp_path / "train.py").write_bytes(content)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "carried", "framework": "pytorch", "entrypoint": {"script": "train.py"},
                                   "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}))
    run = cli("render", job, "-d", tmp_path / "out")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "entrypoint.script:" in run.stderr and message in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()


def test_entrypoint_in_the_image_renders_its_own_path(tmp_path):
    job = tmp_path / "job.yaml"
    base = {"name": "in-image", "framework": "pytorch", "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}
    for entrypoint, tail in (({"script": "/app/train.py", "code": "image", "args": ["-v"]}, ["python", "-m", "hvdk8s.rankmain", "--script", "/app/train.py", "-v"]),
                             ({"module": "my_pkg.train"}, ["python", "-m", "hvdk8s.rankmain", "--module", "my_pkg.train"])):
        job.write_text(yaml.safe_dump({**base, "entrypoint": entrypoint}))
        run = cli("render", job)
        assert run.returncode == 0, run.stderr
        configmap, mpijob = yaml.safe_load_all(run.stdout)
        assert list(configmap["data"]) == ["job.yaml"]  # nothing carried: the code is in the image
        command = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        assert command[-len(tail):] == tail


def test_trainer_jobs_still_need_model_and_dataset(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "x", "framework": "pytorch",
                                   "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}))
    run = cli("validate", job)
    assert run.returncode == 2 and "`model` and `dataset` required" in run.stderr


def test_job_outside_a_launch_says_how_to_start_it(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "HVDK8S_JOB"}
    run = subprocess.run([sys.executable, "-c", "import hvdk8s; hvdk8s.job()"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert run.returncode != 0 and "HVDK8S_JOB" in run.stderr and "hvdk8s launch" in run.stderr


def test_a_jobs_own_script_serves_the_metrics_its_job_turns_on(tmp_path):
    """The adapters read no job file: the rank's entry (hvdk8s.rankmain) names the job, and a script's
    metrics() without a port serve on the job's port, as `hvdk8s launch` runs it; without a job, none."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "own.py").write_text("from hvdk8s import _adapter\n"
                                     "m = _adapter.metrics(0, 0, 1, None)\n"
                                     "print('SERVED', m.enabled and m.server.server_port)\n")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "own-metrics", "framework": "pytorch", "entrypoint": {"script": "own.py"},
                                   "observability": {"metrics": {"enabled": True, "port": port}},
                                   "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}))
    env = {k: v for k, v in os.environ.items() if k != "HVDK8S_JOB"}
    env["HVDK8S_METRICS_ADDRESS"] = "127.0.0.1"
    for job_env, served in (({"HVDK8S_JOB": str(job)}, str(port)), ({}, "False")):
        run = subprocess.run([sys.executable, "-m", "hvdk8s.rankmain", "--script", str(tmp_path / "own.py")],
                             capture_output=True, text=True, env={**env, **job_env}, timeout=60)
        assert run.returncode == 0 and f"SERVED {served}\n" in run.stdout, run.stdout + run.stderr
