"""Pod Security Standards: the checker (hvdk8s.mpijob.podsecurity) control by control, and every rendered
job's pods, as mpi-operator creates them, against the level the job claims (its `hvdk8s.io/pod-security`
annotation, and `kubernetes.pod_security` when set)."""
import copy
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from hvdk8s.mpijob import operator, podsecurity, render
from hvdk8s.mpijob.checks import ClusterJobError
from hvdk8s.spec import load_job

GOLDEN = ROOT / "tests" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "job.yaml").is_file())

RESTRICTED_POD = {
    "metadata": {"labels": {"app": "x"}},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "i", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "persistentVolumeClaim": {"claimName": "c"}},
                    {"name": "s", "secret": {"secretName": "s"}}, {"name": "m", "configMap": {"name": "m"}}],
    },
}
C0 = "spec.containers[0]"


def mutated(**paths):
    """RESTRICTED_POD with fields set: mutated(**{"spec.hostNetwork": True})."""
    pod = copy.deepcopy(RESTRICTED_POD)
    for dotted, value in paths.items():
        node, keys = pod, dotted.replace("[0]", ".0").split(".")
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        node[keys[-1]] = value
    return pod


def test_a_restricted_pod_meets_restricted():
    assert podsecurity.violations(RESTRICTED_POD) == []
    assert podsecurity.level(RESTRICTED_POD) == "restricted"


# (fields set on the restricted pod, the violated level, the path reported)
CONTROLS = [
    ({"spec.hostNetwork": True}, "baseline", "spec.hostNetwork"),
    ({"spec.hostPID": True}, "baseline", "spec.hostPID"),
    ({"spec.hostIPC": True}, "baseline", "spec.hostIPC"),
    ({f"{C0}.securityContext.privileged": True}, "baseline", f"{C0}.securityContext.privileged"),
    ({f"{C0}.securityContext.capabilities.add": ["IPC_LOCK"]}, "baseline", f"{C0}.securityContext.capabilities.add"),
    ({f"{C0}.securityContext.capabilities.add": ["NET_RAW"]}, "baseline", f"{C0}.securityContext.capabilities.add"),
    ({"spec.volumes": [{"name": "h", "hostPath": {"path": "/x"}}]}, "baseline", "spec.volumes[0].hostPath"),
    ({f"{C0}.ports": [{"containerPort": 80, "hostPort": 8080}]}, "baseline", f"{C0}.ports[0].hostPort"),
    ({"spec.securityContext.seccompProfile": {"type": "Unconfined"}}, "baseline",
     "spec.securityContext.seccompProfile.type"),
    ({f"{C0}.securityContext.appArmorProfile": {"type": "Unconfined"}}, "baseline",
     f"{C0}.securityContext.appArmorProfile.type"),
    ({"metadata.annotations": {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}}, "baseline",
     "metadata.annotations[container.apparmor.security.beta.kubernetes.io/c]"),
    ({f"{C0}.securityContext.seLinuxOptions": {"type": "spc_t"}}, "baseline", f"{C0}.securityContext.seLinuxOptions.type"),
    ({"spec.securityContext.seLinuxOptions": {"user": "root"}}, "baseline", "spec.securityContext.seLinuxOptions.user"),
    ({f"{C0}.securityContext.procMount": "Unmasked"}, "baseline", f"{C0}.securityContext.procMount"),
    ({"spec.securityContext.sysctls": [{"name": "kernel.msgmax", "value": "1"}]}, "baseline",
     "spec.securityContext.sysctls[0].name"),
    ({f"{C0}.readinessProbe": {"tcpSocket": {"port": 1, "host": "10.0.0.1"}}}, "baseline",
     f"{C0}.readinessProbe.tcpSocket.host"),
    ({f"{C0}.securityContext.windowsOptions": {"hostProcess": True}}, "baseline",
     f"{C0}.securityContext.windowsOptions.hostProcess"),
    ({"spec.volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}, "restricted", "spec.volumes[0].nfs"),
    ({f"{C0}.securityContext.allowPrivilegeEscalation": True}, "restricted",
     f"{C0}.securityContext.allowPrivilegeEscalation"),
    ({f"{C0}.securityContext": {"capabilities": {"drop": ["ALL"]}}}, "restricted",
     f"{C0}.securityContext.allowPrivilegeEscalation"),  # unset is not false
    ({"spec.securityContext.runAsNonRoot": False}, "restricted", "spec.securityContext.runAsNonRoot"),
    ({f"{C0}.securityContext.runAsUser": 0}, "restricted", f"{C0}.securityContext.runAsUser"),
    ({"spec.securityContext.seccompProfile": {"type": "RuntimeDefault"}, "spec.securityContext.runAsNonRoot": None},
     "restricted", f"{C0}.securityContext.runAsNonRoot"),
    ({f"{C0}.securityContext.capabilities": {"drop": ["NET_RAW"]}}, "restricted",
     f"{C0}.securityContext.capabilities.drop"),
    ({f"{C0}.securityContext.capabilities.add": ["CHOWN"]}, "restricted", f"{C0}.securityContext.capabilities.add"),
]


@pytest.mark.parametrize("fields, broken, path", CONTROLS, ids=[c[2] + ":" + str(i) for i, c in enumerate(CONTROLS)])
def test_each_control(fields, broken, path):
    pod = mutated(**{k: v for k, v in fields.items()})
    if fields.get("spec.securityContext.runAsNonRoot", 1) is None:
        del pod["spec"]["securityContext"]["runAsNonRoot"]
    found = podsecurity.violations(pod)
    assert [(v.level, v.path) for v in found] == [(broken, path)], found
    assert podsecurity.level(pod) == ("privileged" if broken == "baseline" else "baseline")
    assert podsecurity.breaks(pod, "privileged") == []


def test_seccomp_may_be_set_per_container_instead_of_per_pod():
    pod = copy.deepcopy(RESTRICTED_POD)
    del pod["spec"]["securityContext"]["seccompProfile"]
    assert [v.path for v in podsecurity.violations(pod)] == [f"{C0}.securityContext.seccompProfile.type"]
    pod["spec"]["containers"][0]["securityContext"]["seccompProfile"] = {"type": "Localhost",
                                                                        "localhostProfile": "p.json"}
    assert podsecurity.violations(pod) == []


def test_every_kind_of_container_is_checked():
    pod = copy.deepcopy(RESTRICTED_POD)
    pod["spec"]["initContainers"] = [{"name": "init", "image": "i", "securityContext": {"runAsUser": 0}}]
    paths = {v.path for v in podsecurity.violations(pod)}
    assert {"spec.initContainers[0].securityContext.runAsUser",
            "spec.initContainers[0].securityContext.allowPrivilegeEscalation",
            "spec.initContainers[0].securityContext.capabilities.drop"} <= paths


def test_what_issue_9_found_in_the_old_workers_breaks_baseline():
    """IPC_LOCK and a hostPath on every worker kept them out of baseline namespaces; a root init container
    with CHOWN alone is baseline, but not restricted."""
    old = mutated(**{f"{C0}.securityContext.capabilities.add": ["IPC_LOCK"]})
    old["spec"]["volumes"].append({"name": "dataset-cache", "hostPath": {"path": "/var/cache/hvdk8s"}})
    assert podsecurity.level(old) == "privileged"
    chown = copy.deepcopy(RESTRICTED_POD)
    chown["spec"]["initContainers"] = [{"name": "chown", "image": "i", "securityContext": {
        "runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}}]
    assert podsecurity.level(chown) == "baseline"


# --- every rendered job, as the operator creates its pods --------------------------------------------

def operator_pods(job):
    return [(role, pod) for role, pods in operator.pods(job).items() for pod in pods]


@pytest.mark.parametrize("case", CASES)
def test_rendered_pods_meet_the_level_the_job_claims(case):
    spec = load_job(GOLDEN / case / "job.yaml")
    job = render.mpijob(spec)
    claimed = job["metadata"]["annotations"][render.POD_SECURITY_ANNOTATION]
    assert claimed == podsecurity.job_level(spec)
    levels = {}
    for role, pod in operator_pods(job):
        assert pod["spec"]["volumes"][-1]["name"] in ("ssh-auth", "mpi-job-config")  # the operator's additions
        assert podsecurity.breaks(pod, claimed) == [], (role, podsecurity.breaks(pod, claimed))
        levels[role] = podsecurity.level(pod)
    # the claim is the strictest that holds: the least strict pod is exactly at that level
    assert min(levels.values(), key=podsecurity.LEVELS.index) == claimed, levels
    if spec.kubernetes.pod_security:
        assert podsecurity.LEVELS.index(claimed) >= podsecurity.LEVELS.index(spec.kubernetes.pod_security)


EXPECTED_LEVELS = {"cpu": "restricted", "gpu-1x8": "restricted", "gpu-4x8-rdma": "baseline",
                   "gpu-4x8-tcp": "restricted", "nfs-cached": "privileged", "s3-cached": "privileged",
                   "single-node": "restricted"}


def test_the_documented_level_of_each_job_shape():
    assert {case: podsecurity.job_level(load_job(GOLDEN / case / "job.yaml")) for case in CASES} == EXPECTED_LEVELS
    # the launcher never needs more than restricted unless it runs the ranks
    for case in ("nfs-cached", "s3-cached", "gpu-4x8-rdma"):
        (launcher,) = operator.pods(render.mpijob(load_job(GOLDEN / case / "job.yaml")))["Launcher"]
        assert podsecurity.level(launcher) == "restricted"


@pytest.mark.parametrize("overrides, level", [
    ([], "restricted"),
    (["kubernetes.volumes=[{name: d, mount_path: /data, nfs: {server: s, path: /e}}]"], "baseline"),
    (["kubernetes.volumes=[{name: d, mount_path: /data, host_path: /mnt/d}]"], "privileged"),
    (["kubernetes.volumes=[{name: d, mount_path: /data, pvc: c}]", "resources.rdma=true"], "restricted"),
    (["dataset={path: 's3://b/p'}"], "privileged"),
    (["kubernetes.run_launcher_as_worker=true", "dataset={path: 's3://b/p'}"], "privileged"),
    (["kubernetes.run_launcher_as_worker=true"], "restricted"),
])
def test_job_shapes_levels_agree_with_their_pods(overrides, level):
    spec = load_job(GOLDEN / "gpu-1x8" / "job.yaml", ["training.checkpoint={dir: null}", *overrides])
    assert podsecurity.job_level(spec) == level
    pods = operator_pods(render.mpijob(spec))
    assert min((podsecurity.level(p) for _, p in pods), key=podsecurity.LEVELS.index) == level


def test_a_claimed_level_the_pods_exceed_is_refused_naming_the_field():
    nfs = ["kubernetes.volumes=[{name: ckpt, mount_path: /ckpt, nfs: {server: s, path: /e}}]"]
    with pytest.raises(ClusterJobError) as e:
        render.render(load_job(GOLDEN / "gpu-1x8" / "job.yaml", [*nfs, "kubernetes.pod_security=restricted"]))
    assert [p for p, _ in e.value.problems] == ["kubernetes.volumes[0].nfs"]
    assert "restricted" in e.value.problems[0][1] and "PersistentVolumeClaim" in e.value.problems[0][1]
    render.render(load_job(GOLDEN / "gpu-1x8" / "job.yaml", [*nfs, "kubernetes.pod_security=baseline"]))
    with pytest.raises(ClusterJobError) as e:
        render.render(load_job(GOLDEN / "s3-cached" / "job.yaml", ["kubernetes.pod_security=baseline"]))
    assert [p for p, _ in e.value.problems] == ["dataset.path"]


def test_the_cache_warm_daemonset_is_privileged_like_the_cache():
    ds = render.warm_daemonset(load_job(GOLDEN / "s3-cached" / "job.yaml"))
    assert podsecurity.level(ds["spec"]["template"]) == "privileged"


def test_users_can_check_a_rendered_file_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "hvdk8s.mpijob.podsecurity", str(GOLDEN / "s3-cached" / "mpijob.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "MPIJob/cifar-s3 Launcher: restricted" in proc.stdout
    assert "MPIJob/cifar-s3 Worker: privileged" in proc.stdout and "hostPath" in proc.stdout
    docs = list(yaml.safe_load_all((GOLDEN / "cpu" / "mpijob.yaml").read_text()))
    assert podsecurity.main([str(GOLDEN / "cpu" / "mpijob.yaml")]) == 0 and docs
