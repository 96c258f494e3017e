"""`hvdk8s validate` says what `render` and `launch` would say: a GitOps pipeline gates on it.

Both run `mpijob.checks.cluster_problems`. A job file with cluster settings (it sets `kubernetes:` or
`image:`) is refused by validate for everything render refuses; a job file with neither is a local job:
validate passes it (a local launch runs it) and warns, naming the fields, that render would refuse it.
"""
from __future__ import annotations

import re

import pytest

from conftest import ROOT, invoke

GOLDEN = ROOT / "tests" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "job.yaml").is_file())
S3_DATASET = {"name": None, "path": "s3://datasets/digits-shards", "s3": {"credentials_secret": "minio-creds"}}


def fields(stderr: str) -> set[str]:
    """The field paths of an error's or warning's problem lines (`  field.path: message`)."""
    return set(re.findall(r"^  (\S+): ", stderr, re.M))


def test_a_checkpoint_dir_on_no_volume_is_refused_by_validate_as_by_render(job_file):
    path = job_file({"kubernetes": {"namespace": "ml"}})
    overrides = ("--set", "training.checkpoint.dir=/checkpoints/x")
    validate, render = invoke("validate", path, *overrides), invoke("render", path, *overrides)
    assert render.exit_code == 2 and "training.checkpoint.dir" in fields(render.stderr), render.stderr
    assert validate.exit_code == 2, validate.stdout + validate.stderr
    assert "valid (" not in validate.stdout
    assert fields(validate.stderr) == fields(render.stderr) == {"training.checkpoint.dir"}
    assert "cannot run on a cluster as written" in validate.stderr
    assert "/checkpoints/x" in validate.stderr and "is on no volume of kubernetes.volumes" in validate.stderr
    # ...and on a volume, both accept it
    volume = ("--set", "kubernetes.volumes=[{name: ckpt, mount_path: /checkpoints, pvc: ckpt}]")
    assert invoke("validate", path, *overrides, *volume).exit_code == 0
    assert invoke("render", path, *overrides, *volume).exit_code == 0


def test_restricted_pod_security_with_a_cached_s3_dataset_is_refused_by_validate_as_by_render(job_file):
    path = job_file({"dataset": S3_DATASET, "kubernetes": {"namespace": "ml", "pod_security": "restricted"}})
    validate, render = invoke("validate", path, "--no-import"), invoke("render", path)
    assert render.exit_code == 2 and validate.exit_code == 2, validate.stdout + validate.stderr
    assert fields(validate.stderr) == fields(render.stderr) == {"dataset.path"}
    assert "needs the privileged Pod Security level" in validate.stderr
    assert "enforces restricted" in validate.stderr
    # the namespace's real level admits it
    privileged = ("--set", "kubernetes.pod_security=privileged")
    assert invoke("validate", path, "--no-import", *privileged).exit_code == 0
    assert invoke("render", path, *privileged).exit_code == 0


def test_a_local_job_passes_validate_with_a_warning_naming_what_render_would_refuse(job_file):
    # The digits example sets neither `kubernetes:` nor `image:`: a local job, which a local launch runs.
    path = job_file()
    overrides = ("--set", "training.checkpoint.dir=/checkpoints/x")
    validate = invoke("validate", path, *overrides)
    assert validate.exit_code == 0 and "valid (" in validate.stdout, validate.stderr
    assert validate.stderr.startswith("warning:") and "valid for a local launch" in validate.stderr
    assert "`hvdk8s render` and `launch` would refuse it" in validate.stderr
    assert "kubernetes: or image:" in validate.stderr  # what makes validate judge it as a cluster job
    render = invoke("render", path, *overrides)
    assert render.exit_code == 2 and fields(validate.stderr) == fields(render.stderr) == {"training.checkpoint.dir"}
    # The same file with a cluster setting given on the command line is judged as a cluster job.
    assert invoke("validate", path, *overrides, "--set", "kubernetes.namespace=ml").exit_code == 2
    assert invoke("validate", path, *overrides, "--set", "image=registry.example.com/own:1").exit_code == 2
    # Nothing to warn about: nothing on stderr.
    assert invoke("validate", path).stderr == ""


CLUSTER_OVERRIDES = [
    (),
    ("training.checkpoint.dir=/checkpoints/x",),
    ("kubernetes.pod_security=restricted",),
    ("kubernetes.pod_security=baseline",),
    ("kubernetes.env={HOME: /root}",),
    ("observability.dir=/runs/x", "observability.timeline=true"),
    ("kubernetes.run_launcher_as_worker=true",),
    ("image=bad image",),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("overrides", CLUSTER_OVERRIDES, ids=lambda o: ",".join(o) or "as-is")
def test_validate_and_render_agree_on_every_golden_job(case, overrides):
    """For each golden job (all have cluster settings) and each change: validate refuses exactly when render
    does, naming the same fields."""
    sets = [a for o in overrides for a in ("--set", o)]
    job = GOLDEN / case / "job.yaml"
    validate, render = invoke("validate", job, "--no-import", *sets), invoke("render", job, *sets)
    assert render.exit_code in (0, 2) and validate.exit_code == render.exit_code, (validate.stderr, render.stderr)
    assert fields(validate.stderr) == fields(render.stderr)
