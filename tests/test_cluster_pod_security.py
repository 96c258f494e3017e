"""Pod Security against a real API server. `hvdk8s launch` reads the target namespace's Pod Security level
(its pod-security.kubernetes.io/enforce label) and refuses, before creating anything, a job whose pods that
level would reject. And hvdk8s's own checker (hvdk8s.mpijob.podsecurity, used by render, validate and
launch) decides as the project's cluster's PodSecurity admission plugin (Kubernetes 1.35) does, on every
rendered job's pods and on each control, at each level: pods sent with a server-side dry run."""
from __future__ import annotations

import copy
import json

import pytest

from cluster_helpers import job_objects, unique
from test_podsecurity import C0, CASES, CONTROLS, GOLDEN, mutated

LEVELS = ("privileged", "baseline", "restricted")

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


@pytest.fixture(scope="module")
def level_namespaces(cluster):
    """One namespace per level, each enforcing it; {level: namespace}."""
    names = {level: unique(f"psa-{level}") for level in LEVELS}
    for level, name in names.items():
        cluster.kubectl("create", "namespace", name)
        labelled(cluster, name, level)
    yield names
    for name in names.values():
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _admitted(cluster, namespace: str, pod: dict) -> tuple[bool, str]:
    """Whether the API server admits `pod` into `namespace` (dry run: nothing is made), and why not."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(pod)}
    pod["metadata"] = {**pod.get("metadata", {}), "namespace": namespace, "name": unique("pod")}
    pod["metadata"].pop("generateName", None)
    try:
        client.CoreV1Api(cluster.api()).create_namespaced_pod(namespace, pod, dry_run="All")
        return True, ""
    except ApiException as e:
        return False, json.loads(e.body).get("message", e.body)


def _prerequisites(cluster, namespaces, pod: dict) -> None:
    """What admission looks up beside Pod Security: the golden jobs name a ServiceAccount and a PriorityClass."""
    spec = pod.get("spec") or {}
    if spec.get("serviceAccountName"):
        for ns in namespaces.values():
            cluster.kubectl("create", "serviceaccount", spec["serviceAccountName"], "-n", ns, check=False)
    if spec.get("priorityClassName"):
        cluster.kubectl("create", "priorityclass", spec["priorityClassName"], "--value=1000", check=False)


@pytest.mark.parametrize("case", CASES)
def test_the_real_admission_agrees_with_hvdk8s_on_every_rendered_pod(own_cluster, level_namespaces, case):
    """The golden jobs' pods, as mpi-operator creates them (hvdk8s.mpijob.operator), at each level: admitted
    exactly where hvdk8s's checker says they meet it."""
    from hvdk8s.mpijob import operator, podsecurity, render
    from hvdk8s.spec import load_job

    job = render.mpijob(load_job(GOLDEN / case / "job.yaml"))
    checked = 0
    for role, pods in operator.pods(job).items():
        for pod in pods:
            ours = podsecurity.level(pod)
            _prerequisites(own_cluster, level_namespaces, pod)
            for level, namespace in level_namespaces.items():
                admitted, why = _admitted(own_cluster, namespace, pod)
                assert admitted == (LEVELS.index(ours) >= LEVELS.index(level)), (role, level, ours, why)
                if not admitted:
                    assert "violates PodSecurity" in why, why
                checked += 1
    assert checked >= 3  # at least the launcher (a single-node job has no worker pod), at three levels


@pytest.mark.parametrize("fields, broken, path", CONTROLS, ids=[c[2] + ":" + str(i) for i, c in enumerate(CONTROLS)])
def test_the_real_admission_agrees_with_hvdk8s_on_each_control(own_cluster, level_namespaces, fields, broken, path):
    """A restricted pod with one control broken: the real admission refuses it exactly at the levels
    hvdk8s's checker says it breaks."""
    from hvdk8s.mpijob import podsecurity

    pod = mutated(**fields, **VALID_WITH.get(path, {}))
    if fields.get("spec.securityContext.runAsNonRoot", 1) is None:
        del pod["spec"]["securityContext"]["runAsNonRoot"]
    ours = podsecurity.level(pod)
    assert ours != "restricted"
    for level, namespace in level_namespaces.items():
        admitted, why = _admitted(own_cluster, namespace, pod)
        if path in INVALID_ON_LINUX:  # pod validation refuses it before Pod Security is asked
            assert not admitted and "is invalid" in why and "hostProcess" in why, why
            continue
        assert admitted == (LEVELS.index(ours) >= LEVELS.index(level)), (level, ours, why)
        if not admitted:
            assert f'violates PodSecurity "{level}:' in why, why


# What the pod validation of 1.35 needs beside a control for the pod to be valid at all (found by this test):
# a privileged container may not also forbid privilege escalation; an Unmasked /proc needs a user namespace
# (where baseline allows it, restricted not: the checker knows, and the real admission agrees).
VALID_WITH = {
    f"{C0}.securityContext.privileged": {f"{C0}.securityContext.allowPrivilegeEscalation": True},
    f"{C0}.securityContext.procMount": {"spec.hostUsers": False},
}
# Windows host-process containers: refused on a Linux cluster whatever the level.
INVALID_ON_LINUX = {f"{C0}.securityContext.windowsOptions.hostProcess"}
