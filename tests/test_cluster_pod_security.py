"""`hvdk8s launch` reads the target namespace's Pod Security level (its pod-security.kubernetes.io/enforce
label) and refuses, before creating anything, a job whose pods that level would reject, against a real API
server. (The API server of the project's cluster is 1.20, without Pod Security admission: the label is what
a newer server enforces, and what hvdk8s reads.)"""
from __future__ import annotations

import pytest

from cluster_helpers import job_objects, unique

S3_DATASET = {"name": None, "path": "s3://datasets/digits-shards", "s3": {"credentials_secret": "minio-creds"}}
NFS_VOLUMES = [{"name": "data", "mount_path": "/data", "nfs": {"server": "nfs.example.com", "path": "/exports/d"}}]
# (what the job adds, the level its pods need, the field that needs it)
SHAPES = {"cached-s3": ({"dataset": S3_DATASET}, "privileged", "dataset.path"),
          "nfs": ({"kubernetes": {"volumes": NFS_VOLUMES}}, "baseline", "kubernetes.volumes[0].nfs")}


def labelled(cluster, namespace: str, level: str) -> None:
    cluster.kubectl("label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}")


def shaped_job(job_file, namespace: str, shape: str):
    changes, _, _ = SHAPES[shape]
    name = unique(shape)
    kubernetes = {"namespace": namespace, **changes.get("kubernetes", {})}
    return job_file({**changes, "name": name, "kubernetes": kubernetes}), name


@pytest.mark.parametrize("shape, enforced", [("cached-s3", "baseline"), ("cached-s3", "restricted"),
                                             ("nfs", "restricted")])
def test_launch_refuses_a_job_the_namespace_would_reject_and_creates_nothing(cluster, namespace, job_file,
                                                                             shape, enforced):
    _, need, field = SHAPES[shape]
    labelled(cluster, namespace, enforced)
    path, name = shaped_job(job_file, namespace, shape)
    run = cluster.cli("launch", path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"namespace {namespace} enforces the {enforced} Pod Security level "
            f"(pod-security.kubernetes.io/enforce={enforced}) and would reject this job's pods, which need "
            f"{need}; nothing was created") in run.stderr, run.stderr
    assert f"  {field}: " in run.stderr and f"(needs {need})" in run.stderr
    assert "Traceback" not in run.stderr and "created" not in run.stdout
    assert job_objects(cluster, namespace, name) == (None, None)


@pytest.mark.parametrize("shape, enforced", [("cached-s3", "privileged"), ("nfs", "baseline"), ("nfs", None)])
def test_launch_creates_a_job_the_namespace_admits_and_notes_its_level(cluster, namespace, job_file, shape,
                                                                       enforced):
    _, need, _ = SHAPES[shape]
    if enforced:
        labelled(cluster, namespace, enforced)
    path, name = shaped_job(job_file, namespace, shape)
    run = cluster.cli("launch", path)
    assert run.returncode == 0, run.stderr
    assert f"created mpijob/{name}" in run.stdout
    assert f"note: job '{name}' needs the {need} Pod Security level" in run.stderr
    job, configmap = job_objects(cluster, namespace, name)
    assert job is not None and configmap is not None
    assert job["metadata"]["annotations"]["hvdk8s.io/pod-security"] == need
