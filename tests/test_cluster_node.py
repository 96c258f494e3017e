"""The real node (issue 28, items 4-5): a cluster of its own (scripts/k8s/start-135.sh with the real
mpi-operator) plus one node that runs containers (scripts/k8s/node.sh: containerd, runc, kubelet 1.35,
the CNI bridge and CoreDNS in a network namespace of their own). Pods really run here; logs come from the
real kubelet through the API server.

Skipped when scripts/k8s/build-node.sh has not built the node's binaries on this machine (CI builds them
first: `bash scripts/k8s/build-node.sh`); the control plane (build-135.sh) is built on demand as by
start-135.sh."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster_helpers import api_client, diagnose
from conftest import events_of

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "scripts" / "k8s"
DIGITS_JOB = ROOT / "examples" / "digits.yaml"
HELD_DIGITS = ROOT / "tests" / "user_code" / "held_digits.py"


def _built() -> str | None:
    """Why the node cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces, cgroups)"
    if shutil.which("kubectl") is None or shutil.which("socat") is None:
        return "needs kubectl and socat"
    check = subprocess.run(["bash", str(K8S / "build-node.sh"), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        return f"the node's binaries are not built on this machine (bash scripts/k8s/build-node.sh): {check.stderr.strip()}"
    return None


_UNBUILT = _built()
if _UNBUILT is not None and os.environ.get("CI"):  # CI builds the node first (.ci/run): a core path never skips there
    raise RuntimeError(f"the real-node tests cannot run in CI: {_UNBUILT}")
# `real_node`: the jobs here run real Horovod ranks in the node's pods, whose CPU limits (2 x 500m workers,
# a 1-CPU launcher) hold them to the machine's 2 cores; under scripts/test.sh the whole file goes to a
# worker of its own beside the rank tests (tests/workgroups.py), with one cluster and node for the module.
pytestmark = [pytest.mark.skipif(_UNBUILT is not None, reason=str(_UNBUILT)), pytest.mark.real_node]


# kubectl's names for what the tests read -> (the API's path for the group and version, the resource)
_RESOURCES = {"pod": ("api/v1", "pods"), "pods": ("api/v1", "pods"), "node": ("api/v1", "nodes"),
              "services": ("api/v1", "services"), "secrets": ("api/v1", "secrets"),
              "configmaps": ("api/v1", "configmaps"), "jobs.batch": ("apis/batch/v1", "jobs"),
              "mpijob": ("apis/kubeflow.org/v2beta1", "mpijobs"), "mpijobs": ("apis/kubeflow.org/v2beta1", "mpijobs"),
              "workloads": ("apis/kueue.x-k8s.io/v1beta2", "workloads")}


class Node:
    """The cluster and its node: kubectl against it (the tests' changes), the official Python client (their
    reads: a poll each half second was a kubectl process, ~0.08 CPU-s, hundreds of them a run), the node's
    image."""

    def __init__(self, state: Path):
        self.state = state
        self.kubeconfig = state / "kubeconfig"
        env = dict(line.split("=", 1) for line in (state / "node" / "env").read_text().splitlines() if "=" in line)
        self.name = env["NODE_NAME"]
        self.image = env["NODE_IMAGE"]
        self._client = None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        out = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=input,
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out

    def get(self, kinds: str, *args: str) -> dict:
        """What `kubectl get KINDS [-n NS] [-l SELECTOR] [NAME] -o json` prints (KINDS: names as kubectl takes
        them, comma-separated for a list), read through the Python client; AssertionError where it fails."""
        found = self.find(kinds, *args)
        if found is None:
            raise AssertionError(f"kubectl get {kinds} {' '.join(args)}: not found")
        return found

    def find(self, kinds: str, *args: str) -> dict | None:
        """As get, but None where the named object does not exist."""
        namespace, selector, names = None, None, []
        rest = iter(args)
        for arg in rest:
            if arg == "-n":
                namespace = next(rest)
            elif arg == "-l":
                selector = next(rest)
            else:
                names.append(arg)
        items, api = [], self.client()
        for kind in kinds.split(","):
            group, plural = _RESOURCES[kind]
            path = "/".join([group, *(["namespaces", namespace] if namespace else []), plural, *names[:1]])
            request = api.param_serialize("GET", "/" + path, auth_settings=["BearerToken"],
                                          query_params=[("labelSelector", selector)] if selector else [])
            response = api.call_api(*request, _request_timeout=60)
            if response.status == 404 and names:
                return None
            if response.status != 200:
                raise AssertionError(f"GET /{path}: {response.status} {response.reason}: {response.read()[:500]!r}")
            found = json.loads(response.read())
            if names:
                return found
            items += found["items"]
        return {"items": items}

    def client(self):
        """An admin ApiClient of the tests' own, kept for the module (one connection for every poll)."""
        if self._client is None:
            self._client = api_client(self.kubeconfig)
        return self._client

    def wait_for(self, what: str, condition, timeout: float = 180, every: float = 0.5):
        """Poll until condition() returns something truthy (and return it); fail after timeout with what."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(every)

    def pod_phase(self, ns: str, name: str) -> str:
        return self.get("pod", "-n", ns, name).get("status", {}).get("phase", "")

    def diagnose(self, ns: str) -> str:
        return diagnose(self.kubectl, ns)


def _sh(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def the_node(tmp_path_factory):
    """One cluster and node for the module (each start costs minutes of a 2-core machine)."""
    state = tmp_path_factory.mktemp("k8s-node")
    started = _sh(K8S / "start-135.sh", state, "--kueue")  # Kueue leaves jobs without a queue label alone
    try:
        assert started.returncode == 0, f"start-135.sh failed:\n{started.stderr[-4000:]}"
        up = _sh(K8S / "node.sh", state, "start")
        assert up.returncode == 0, f"node.sh start failed:\n{up.stderr[-4000:]}"
        yield Node(state)
    finally:
        _sh(K8S / "node.sh", state, "stop", timeout=120)
        _sh(K8S / "stop-135.sh", state, timeout=120)


@pytest.fixture
def node(the_node):
    """The module's node, handed on empty: whatever a test leaves in `default` (a failed test's MPIJob goes
    on running and holds the node's CPU, so the next job's workers would stay Pending) is deleted after it."""
    yield the_node
    left = the_node.get("mpijobs", "-n", "default")["items"]
    if left:
        the_node.kubectl("delete", "mpijobs", "-n", "default", "--all", "--wait=false")
    the_node.wait_for("the jobs' pods left in default to go", lambda: not the_node.get(
        "pods", "-n", "default", "-l", "hvdk8s.io/job")["items"], timeout=180)


def restricted_namespace(node: Node, name: str) -> str:
    """A namespace that enforces PodSecurity restricted (what hvdk8s's rendered pods satisfy)."""
    node.kubectl("create", "namespace", name)
    node.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    return name


def restricted_pod(name: str, image: str, command: list[str], **spec) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
                            "securityContext": {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}}}],
            **spec,
        },
    }


def test_node_is_ready_and_runs_a_restricted_pod(node):
    """The real node is Ready and untainted; a restricted pod (non-root, seccomp RuntimeDefault, no capabilities) runs
    `echo hello` on it and `kubectl logs` returns hello through the API server from the kubelet."""
    ready = node.get("node", node.name)
    assert {c["type"]: c["status"] for c in ready["status"]["conditions"]}["Ready"] == "True"
    assert ready["status"]["nodeInfo"]["kubeletVersion"] == "v1.35.8"
    assert ready["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    # Schedulable: the not-ready taint was lifted by the cluster's own controller-manager (start-135.sh runs
    # node-lifecycle-controller even without kwok nodes); node.sh starts no second one (difference 2).
    assert not ready["spec"].get("taints"), ready["spec"]
    kcm = (node.state / "controller-manager.pid").read_text().strip()
    assert "node-lifecycle-controller" in Path(f"/proc/{kcm}/cmdline").read_bytes().decode()
    assert not list((node.state / "node").glob("*lifecycle*")), sorted(p.name for p in (node.state / "node").iterdir())
    ns = restricted_namespace(node, "hello")
    pod = restricted_pod("hello", node.image, ["echo", "hello"])
    node.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(pod))
    phase = node.wait_for("the pod to finish",
                          lambda: (p := node.pod_phase(ns, "hello")) in ("Succeeded", "Failed") and p)
    assert phase == "Succeeded", node.diagnose(ns)
    served = node.get("pod", "-n", ns, "hello")
    assert served["spec"]["nodeName"] == node.name
    assert node.kubectl("logs", "-n", ns, "hello").stdout == "hello\n"


def ssh_secret(name: str, tmp: Path) -> dict:
    """A kubernetes.io/ssh-auth Secret with a fresh key pair, as mpi-operator makes for each job."""
    key = tmp / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    import base64
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "kubernetes.io/ssh-auth",
            "data": {"ssh-privatekey": b64(key), "ssh-publickey": b64(key.with_suffix(".pub"))}}


# The operator's SSH volume for a non-root sshAuthMountPath (docs/k8s-stack.md, difference 3).
SSH_VOLUME = {"name": "ssh-auth", "secret": {"secretName": "ssh", "defaultMode": 420, "items": [
    {"key": "ssh-privatekey", "path": "id_rsa"}, {"key": "ssh-publickey", "path": "id_rsa.pub"},
    {"key": "ssh-publickey", "path": "authorized_keys"}]}}
SSH_MOUNT = {"name": "ssh-auth", "mountPath": "/home/mpiuser/.ssh"}


def test_pods_resolve_each_other_and_ssh_as_mpiuser(node, tmp_path):
    """Two sshd pods (the image's default command) behind a headless Service, named as the operator names
    workers (hostname + subdomain); a third pod reaches both by `<pod>.<service>.<ns>.svc` (the hostfile's
    names, no cluster domain) with ssh on 2222 as mpiuser, using the key pair from a Secret mounted as the
    operator mounts it."""
    ns = restricted_namespace(node, "sshpair")
    node.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(ssh_secret("ssh", tmp_path)))
    node.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "pair"},
        "spec": {"clusterIP": "None", "selector": {"role": "sshd"}, "publishNotReadyAddresses": True}}))
    for i in range(2):
        pod = restricted_pod(f"w{i}", node.image, ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"],
                             hostname=f"w{i}", subdomain="pair", volumes=[SSH_VOLUME])
        pod["metadata"]["labels"] = {"role": "sshd"}
        pod["spec"]["securityContext"]["fsGroup"] = 1000  # as hvdk8s renders (mpijob/security.py)
        pod["spec"]["containers"][0].update(volumeMounts=[SSH_MOUNT], readinessProbe={
            "tcpSocket": {"port": 2222}, "periodSeconds": 1})
        node.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(pod))
    for i in range(2):
        node.wait_for(f"w{i} Ready", lambda i=i: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in node.get("pod", "-n", ns, f"w{i}").get("status", {}).get("conditions", [])))
    names = [f"w{i}.pair.{ns}.svc" for i in range(2)]
    client = restricted_pod("client", node.image, ["sh", "-c", " && ".join(
        f"getent hosts {n} && ssh -o BatchMode=yes {n} 'echo reached $(hostname) as $(id -un)'" for n in names)],
        volumes=[SSH_VOLUME])
    client["spec"]["securityContext"]["fsGroup"] = 1000
    client["spec"]["containers"][0]["volumeMounts"] = [SSH_MOUNT]
    node.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(client))
    phase = node.wait_for("the client to finish",
                          lambda: (p := node.pod_phase(ns, "client")) in ("Succeeded", "Failed") and p)
    log = node.kubectl("logs", "-n", ns, "client").stdout
    assert phase == "Succeeded", log + node.diagnose(ns)
    ips = {i: node.get("pod", "-n", ns, f"w{i}")["status"]["podIP"] for i in range(2)}
    for i, name in enumerate(names):
        assert f"{ips[i]}" in log and name in log, log
        assert f"reached w{i} as mpiuser" in log, log


def digits_on_the_node(node: Node, path: Path) -> Path:
    """examples/digits.yaml as 2 workers x 1 rank on the node's image, with the host's Python mounted into
    the rank pods (scripts/k8s/build-node-image.sh says why): the venv at /opt/hvdk8s-host, the checkout
    its editable install points to, and the pyenv Python the venv links to, each at its own path (a venv of
    Debian's own Python runs on the image's, the same)."""
    venv = Path(sys.prefix)
    python = Path(os.path.realpath(venv / "bin" / "python"))
    base = python.parent.parent
    volumes = [{"name": "venv", "host_path": str(venv), "mount_path": "/opt/hvdk8s-host", "read_only": True},
               {"name": "checkout", "host_path": str(ROOT), "mount_path": str(ROOT), "read_only": True}]
    if base == Path("/usr"):  # the distribution's: the image (Debian bookworm's python3) has it at that path
        if python.name != "python3.11":
            pytest.skip(f"the venv's Python is {python}; the node's image (Debian bookworm) has python3.11")
    elif base == Path("/usr/local"):  # mounted, it would hide the image's own /usr/local
        pytest.skip(f"the venv's Python lives in {base}: mount it only from a self-contained install (pyenv)")
    else:
        volumes.append({"name": "python", "host_path": str(base), "mount_path": str(base), "read_only": True})
    job = yaml.safe_load(DIGITS_JOB.read_text())
    job["image"] = node.image
    job["resources"].update(workers=2, ranks_per_worker=1, cpu="500m", memory="2Gi")  # + the launcher's 1 CPU: 2 cores
    job["kubernetes"] = {"image_pull_policy": "Never", "volumes": volumes}
    path.write_text(yaml.safe_dump(job))
    return path


def hvdk8s(node: Node, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdk8s", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "KUBECONFIG": str(node.kubeconfig)})


FAILING_SCRIPT = '''"""Rank 1 fails at once; rank 0 waits for it in an allreduce until mpirun ends the job."""
import horovod.torch as hvd
import torch

hvd.init()
if hvd.rank() == 1:
    raise RuntimeError("boom on rank 1")
hvd.allreduce(torch.zeros(1))
'''


def test_a_failing_rank_fails_the_job_and_is_named_by_logs_follow(node, tmp_path):
    """A script job (`entrypoint`, carried in the job's ConfigMap) whose rank 1 raises: `hvdk8s launch --wait`
    and `hvdk8s logs -f`, following the launcher through the real kubelet from the start, end with exit 1 and
    name rank 1, its exception and the script's line; the operator marks the MPIJob Failed. Afterwards the
    failed launcher pod is still there (restartPolicy Never: the Job keeps it; with OnFailure the Job
    controller deleted it, log and all: docs/k8s-stack.md section 6, difference 5), so `hvdk8s logs` and
    `hvdk8s wait` name the rank too. `kubectl delete mpijob` leaves nothing of the job. backoff_limit 0: one
    launcher attempt."""
    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    job = yaml.safe_load(digits_on_the_node(node, tmp_path / "digits.yaml").read_text())
    for field in ("model", "dataset"):
        job.pop(field)
    job.update(name="fail-rank", entrypoint={"script": "fail.py"}, training={"epochs": 1})
    job["kubernetes"]["backoff_limit"] = 0
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    expected = "rank 1 failed first: RuntimeError: boom on rank 1 (fail.py:7)"
    waiting = subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--wait", "--timeout", "5m",
                                str(tmp_path / "job.yaml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env={**os.environ, "KUBECONFIG": str(node.kubeconfig)})
    try:
        node.wait_for("the MPIJob", lambda: node.find("mpijob", "-n", "default", "fail-rank") is not None
                      or waiting.poll() is not None)
        followed = hvdk8s(node, "logs", "-f", "fail-rank", timeout=300)
        out, errors = waiting.communicate(timeout=300)
    finally:
        waiting.kill()
    assert waiting.returncode == 1 and errors.strip().splitlines()[-1] == expected, out + errors
    assert "mpijob/fail-rank: Failed" in errors, errors
    assert followed.returncode == 1, followed.stdout + followed.stderr
    assert followed.stderr.strip().splitlines()[-1] == expected, followed.stderr
    conditions = node.wait_for("the MPIJob's Failed condition", lambda: {
        c["type"]: c["status"] for c in node.get("mpijob", "-n", "default", "fail-rank")["status"].get("conditions", [])
    }.get("Failed") == "True")
    assert conditions
    launchers = node.get("pods", "-n", "default", "-l", "hvdk8s.io/job=fail-rank,hvdk8s.io/role=launcher")["items"]
    assert [p["status"]["phase"] for p in launchers] == ["Failed"], node.diagnose("default")
    after = hvdk8s(node, "logs", "fail-rank")  # read after the end, from the kept pod
    assert after.returncode == 0 and after.stderr.strip().splitlines()[-1] == expected, after.stdout + after.stderr
    waited = hvdk8s(node, "wait", "fail-rank")
    assert waited.returncode == 1 and waited.stderr.strip().splitlines()[-1] == expected, waited.stderr
    # `kubectl delete mpijob` alone cleans up: the garbage collector removes what the operator made (launcher
    # Job, pods, Service, SSH Secret, hostfile ConfigMap) and hvdk8s's job ConfigMap (owned by the MPIJob).
    node.kubectl("delete", "mpijob", "-n", "default", "fail-rank")

    def left() -> list[str]:
        kinds = "pods,jobs.batch,services,secrets,configmaps"
        return [i["metadata"]["name"] for i in node.get(kinds, "-n", "default")["items"]
                if i["metadata"]["name"].startswith("fail-rank")]

    node.wait_for("nothing of the job left", lambda: not left(), timeout=120)


QUEUES = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: node}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: "2"}
      - {name: memory, nominalQuota: 8Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team, namespace: default}
spec: {clusterQueue: node}
"""


def test_checkpoint_on_a_volume_survives_a_deleted_worker(node, tmp_path):
    """Checkpoints on a node volume (hostPath): a worker pod deleted mid-training kills that mpirun; the
    operator recreates the worker, the launcher Job retries in a new pod (restartPolicy Never; the failed
    one stays), which waits for both workers, and the ranks resume from the newest checkpoint and finish;
    the MPIJob Succeeds. The digits come from tests/user_code/held_digits.py, whose rank 0 holds the first
    run at its third epoch until the deleted worker ends it: the job cannot end before the test deletes
    the worker, at any speed."""
    epochs = 5
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt.chmod(0o777)  # the ranks run as uid 1000; hostPath volumes keep the host's ownership
    job = yaml.safe_load(digits_on_the_node(node, tmp_path / "digits.yaml").read_text())
    job["name"] = "digits-ckpt"
    job["dataset"] = {"factory": "held_digits:digits_held_once", "args": {"marker": "/ckpt/held"}}
    job["training"].update(epochs=epochs, checkpoint={"dir": "/ckpt/digits"})
    job["kubernetes"]["volumes"].append({"name": "ckpt", "host_path": str(ckpt), "mount_path": "/ckpt"})
    job["kubernetes"]["env"] = {"PYTHONPATH": str(HELD_DIGITS.parent)}  # mpirun passes it to the ranks
    shutil.copy(HELD_DIGITS, tmp_path)  # beside the job file, for hvdk8s launch's own check
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert hvdk8s(node, "launch", str(tmp_path / "job.yaml")).returncode == 0
    node.wait_for("the first run to hold at its third epoch", (ckpt / "held").exists, timeout=300)
    assert (ckpt / "digits" / "epoch-00002.ckpt").exists(), sorted(p.name for p in (ckpt / "digits").iterdir())
    first_uid = node.get("pod", "-n", "default", "digits-ckpt-worker-1")["metadata"]["uid"]
    node.kubectl("delete", "pod", "-n", "default", "digits-ckpt-worker-1", "--wait=false")

    def ended() -> str:
        conditions = node.get("mpijob", "-n", "default", "digits-ckpt")["status"].get("conditions", [])
        return next((c["type"] for c in conditions if c["type"] in ("Succeeded", "Failed") and c["status"] == "True"), "")

    assert node.wait_for("the MPIJob to end", ended, timeout=420) == "Succeeded", node.diagnose("default")
    launchers = sorted(node.get("pods", "-n", "default", "-l", "hvdk8s.io/job=digits-ckpt,hvdk8s.io/role=launcher")
                       ["items"], key=lambda p: p["metadata"]["creationTimestamp"])
    phases = [p["status"]["phase"] for p in launchers]
    assert len(phases) >= 2 and set(phases[:-1]) == {"Failed"} and phases[-1] == "Succeeded", phases
    # The launcher's last run (the newest pod), its events as records:
    log = hvdk8s(node, "logs", "--log-format", "json", "digits-ckpt").stdout
    resumed = [e for e in events_of(log, "resume") if e["path"].startswith("/ckpt/digits/epoch-")]
    assert resumed and resumed[0]["epoch"] >= 2, log
    assert [e["epochs"] for e in events_of(log, "done")] == [epochs], log
    second = node.get("pods", "-n", "default", "-l", "hvdk8s.io/job=digits-ckpt,hvdk8s.io/role=worker")["items"]
    assert first_uid not in {p["metadata"]["uid"] for p in second}  # worker-1 is a new pod (or already gone)
    assert hvdk8s(node, "delete", "digits-ckpt").returncode == 0
    node.wait_for("the job's pods to go", lambda: not node.get(
        "pods", "-n", "default", "-l", "hvdk8s.io/job=digits-ckpt")["items"], timeout=120)


@pytest.mark.timeout(900)  # its own waits (up to 300 s each) end first, saying what the job did
def test_an_elastic_job_loses_and_regains_a_worker(node, tmp_path):
    """An elastic job (training.elastic, 1..2 workers): the launcher runs horovodrun (Horovod from the mounted
    venv: volumes marked `launcher: true`) over the operator's discover_hosts.sh. A worker pod deleted while
    it trains takes its rank down; the job goes on at 1 rank; the operator recreates the pod under the same
    DNS name, which horovodrun takes back once its blacklist cooldown ends (without the rendered
    --blacklist-cooldown-range it never would: docs/k8s-stack.md section 6, difference 6), and the job
    finishes at 2 ranks with every epoch trained; the operator marks the MPIJob Succeeded. The digits come
    from tests/user_code/held_digits.py (in the mounted checkout), whose rank 0 holds each epoch from the
    third on until the loss, then the return, of the worker has reached it: the events come in this order
    at any speed."""
    epochs = 6
    job = yaml.safe_load(digits_on_the_node(node, tmp_path / "digits.yaml").read_text())
    job["name"] = "digits-elastic"
    job["dataset"] = {"factory": "held_digits:digits_held_at_changes", "args": {"framework": "pytorch"}}
    job["training"].update(epochs=epochs, elastic={"min_workers": 1, "max_workers": 2, "commit_every_steps": 4})
    job["kubernetes"]["env"] = {"PYTHONPATH": str(HELD_DIGITS.parent)}  # horovodrun passes it to the ranks
    for volume in job["kubernetes"]["volumes"]:
        volume["launcher"] = True
    shutil.copy(HELD_DIGITS, tmp_path)  # beside the job file, for hvdk8s launch's own check
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    launched = hvdk8s(node, "launch", str(tmp_path / "job.yaml"))
    assert launched.returncode == 0, launched.stdout + launched.stderr

    unread = []  # why `hvdk8s logs` read nothing, the last time it did not (the kubelet is slow on a busy host)
    seen: list[dict] = []  # the events of the last read that worked

    def events() -> list[dict]:  # rank 0's events in the launcher's log so far (the last ones read, if not now)
        try:
            read = hvdk8s(node, "logs", "--log-format", "json", "digits-elastic", timeout=60)
        except subprocess.TimeoutExpired:
            unread[:] = ["hvdk8s logs took over 60 s"]
            return list(seen)
        if read.returncode != 0:
            unread[:] = [read.stderr]
            return list(seen)
        seen[:] = events_of(read.stdout, "epoch", "elastic", "done")
        return list(seen)

    def sizes() -> list[int]:  # the rank counts the job went through, in order
        return [e["ranks"] for e in events() if e["event"] == "elastic"]

    def regained() -> bool:  # 2 ranks again, after 1
        now = sizes()
        return 1 in now and 2 in now[now.index(1):]

    def ended() -> str:
        conditions = node.get("mpijob", "-n", "default", "digits-elastic")["status"].get("conditions", [])
        return next((c["type"] for c in conditions if c["type"] in ("Succeeded", "Failed") and c["status"] == "True"), "")

    def until(what: str, condition) -> None:  # condition() or the job's end, whichever comes first
        try:
            node.wait_for(what, lambda: condition() or ended(), timeout=300, every=2)
        except AssertionError as timed_out:  # say what the job did meanwhile, and horovodrun's own word
            said = []
            for args in (("logs", "-n", "default", "job/digits-elastic-launcher", "--tail=40"),
                         ("get", "pods", "-n", "default", "-o", "custom-columns=NAME:.metadata.name,PHASE:.status"
                          ".phase,STATES:.status.containerStatuses[*].state,CREATED:.metadata.creationTimestamp"),
                         ("get", "mpijob", "-n", "default", "digits-elastic", "-o", "jsonpath={.status}"),
                         ("get", "events", "-n", "default", "--sort-by=.lastTimestamp")):
                try:
                    got = node.kubectl(*args, check=False, timeout=30)
                    said.append(f"$ kubectl {' '.join(args[:2])}:\n{(got.stdout + got.stderr)[-3000:]}")
                except Exception as e:  # noqa: BLE001 - the timeout is the failure; this only adds to it
                    said.append(f"$ kubectl {' '.join(args[:2])}: {e!r}")
            raise AssertionError(f"{timed_out}: {seen} {unread}\n" + "\n".join(said)) from None
        assert condition(), f"the job ended ({ended()}) before {what}: {events()} {unread}" + node.diagnose("default")

    until("the second epoch", lambda: any(e["event"] == "epoch" and e["epoch"] >= 2 for e in events()))
    first_uid = node.get("pod", "-n", "default", "digits-elastic-worker-1")["metadata"]["uid"]
    node.kubectl("delete", "pod", "-n", "default", "digits-elastic-worker-1", "--wait=false")
    until("the job on 1 rank", lambda: 1 in sizes())
    until("the job on 2 ranks again", regained)
    assert node.wait_for("the MPIJob to end", ended, timeout=420) == "Succeeded", events()
    seen = events()
    assert [e["epoch"] for e in seen if e["event"] == "epoch"][-1] == epochs, seen
    done = [e for e in seen if e["event"] == "done"]
    assert done and done[0]["test_accuracy"] > 0.9, seen
    workers = node.get("pods", "-n", "default", "-l", "hvdk8s.io/job=digits-elastic,hvdk8s.io/role=worker")["items"]
    assert first_uid not in {p["metadata"]["uid"] for p in workers}
    assert hvdk8s(node, "delete", "digits-elastic").returncode == 0
    node.wait_for("the job's pods to go", lambda: not node.get(
        "pods", "-n", "default", "-l", "hvdk8s.io/job=digits-elastic")["items"], timeout=120)


@pytest.fixture
def digits_served_to_the_node(node, tmp_path):
    """The digits dataset in the shard format with its hvdk8s-manifest.json (`hvdk8s cache manifest`), served
    over HTTP on the host's 127.0.0.1 and relayed into the node (`node.sh STATE relay PORT`): yields the URL
    the node's pods sync from, the served directory and the bytes served per path."""
    from test_cache_launch import serving_digits

    root = tmp_path / "served"
    with serving_digits(root) as (port, served):
        relayed = _sh(K8S / "node.sh", node.state, "relay", port, timeout=60)
        assert relayed.returncode == 0, relayed.stderr
        address = relayed.stdout.strip().splitlines()[-1]
        assert address == f"10.88.0.1:{port}", relayed.stdout
        # On the host the port has the server's loopback listener only (the relay's TCP end is in the node).
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                                   text=True, check=True).stdout.split("\n")
        assert [line.split()[3] for line in listening if line.strip()] == [f"127.0.0.1:{port}"]
        yield f"http://{address}/hvdk8s-manifest.json", root, served


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_digits_trains_on_the_operator_and_node_from_the_node_cache_and_a_second_job_reuses_it(
        node, tmp_path, digits_served_to_the_node):
    """`hvdk8s launch --wait` of the digits example whose dataset is an http:// source (node-cached): the
    real mpi-operator creates the workers, then (once they are Ready) the launcher; each worker's init
    containers (rendered by hvdk8s: chown with CAP_CHOWN, then `hvdk8s cache sync` as uid 1000 with the
    image's own Python) sync the dataset onto the node's hostPath `<cache_dir>/default`, from a server on
    the host's loopback reached through node.sh's relay; mpirun reaches the workers over ssh by their DNS
    names, the ranks train from the node's copy, the operator marks the MPIJob Succeeded, which ends the
    wait (exit 0); `hvdk8s logs` and `logs -f` read the launcher's log through the real kubelet and show the
    accuracy; `hvdk8s delete` removes it all. Both workers share the node, so the dataset is fetched once;
    afterwards the hostPath holds the complete, verified copy (its manifest, every file's sha256 and bytes
    equal to the source's). A second job on the same node, queued through real Kueue, reuses it: its sync
    finds every file in place (last-sync.json: nothing missed, 0 bytes copied), the manifest is the first
    sync's, last-used moves on, and the server sends no data file again. On the host the relay adds no TCP
    listener: the served port has only the server's on 127.0.0.1. (One test: each job on the node costs
    minutes of pods starting on a 2-core machine.)"""
    from hvdk8s.data import cache

    url, source, served = digits_served_to_the_node
    cache_dir = tmp_path / "node-cache"  # kubernetes.cache_dir: the node's hostPath is <cache_dir>/default
    job = yaml.safe_load(digits_on_the_node(node, tmp_path / "digits.yaml").read_text())
    job.update(dataset={"path": url, "version": "v1"})
    job["kubernetes"]["cache_dir"] = str(cache_dir)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))

    def run(name: str, epochs: int, *options: str) -> float:
        job["name"] = name
        job["training"]["epochs"] = epochs
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(job))
        launched = hvdk8s(node, "launch", "--wait", "--timeout", "8m", *options, str(tmp_path / f"{name}.yaml"))
        assert launched.returncode == 0, launched.stdout + launched.stderr + node.diagnose("default")
        assert f"mpijob/{name}: Succeeded" in launched.stderr, launched.stderr
        logs = hvdk8s(node, "logs", name)
        done = [line for line in logs.stdout.splitlines() if line.startswith("done: test accuracy")]
        assert done, logs.stdout + logs.stderr
        assert f"epoch {epochs}/{epochs}" in logs.stdout, logs.stdout
        if not options:  # the operator's view of the first job, and its log followed to the end
            status = node.get("mpijob", "-n", "default", name)["status"]
            assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"
            assert status["replicaStatuses"]["Launcher"] == {"succeeded": 1}
            # A CPU job forwards no LD_LIBRARY_PATH, which its image does not set (mpirun warned of it: difference 4).
            assert "could not find environment variable" not in logs.stdout + logs.stderr, logs.stdout
            followed = hvdk8s(node, "logs", "-f", name, timeout=120)
            assert followed.returncode == 0 and done[0] in followed.stdout, followed.stdout + followed.stderr
        if options:  # through Kueue: its Workload was admitted and finished; the launcher waited for the workers
            workloads = node.get("workloads", "-n", "default")["items"]
            assert len(workloads) == 1
            conditions = {c["type"]: c["status"] for c in workloads[0]["status"]["conditions"]}
            assert conditions["Admitted"] == "True" and conditions["Finished"] == "True", conditions
            raw = hvdk8s(node, "logs", "--raw", name).stdout
            assert "hvdk8s: waiting up to 900s for 2 worker(s) to answer ssh on port 2222" in raw, raw
            assert "hvdk8s: all 2 worker(s) answer ssh after " in raw, raw
        assert hvdk8s(node, "delete", name).returncode == 0
        node.wait_for("the job's pods to go", lambda: not node.get(
            "pods", "-n", "default", "-l", f"hvdk8s.io/job={name}")["items"], timeout=120)
        return float(done[0].split()[3].rstrip("%"))

    def data_served() -> dict:
        return {path: n for path, n in served.items() if not path.endswith("hvdk8s-manifest.json")}

    assert run("digits-mlp", 6) > 90  # trained from the node's copy
    # The node's cache: <cache_dir>/<namespace>/<key>/, complete (manifest.json written last) and verified.
    node_cache = cache_dir / "default"
    local = cache.cached_path(url, node_cache, "v1")
    assert local is not None, sorted(str(p) for p in node_cache.rglob("*"))
    dataset = local.parent
    manifest = json.loads((dataset / "manifest.json").read_text())
    source_files = sorted(str(p.relative_to(source)) for p in source.rglob("*")
                          if p.is_file() and p.name != "hvdk8s-manifest.json")
    assert sorted(e["path"] for e in manifest["files"]) == source_files
    for entry in manifest["files"]:
        copy = local / entry["path"]
        assert copy.stat().st_size == entry["size"] and _sha256(copy) == entry["sha256"], entry
        assert copy.read_bytes() == (source / entry["path"]).read_bytes(), entry["path"]
        assert copy.stat().st_uid == 1000  # written by the sync container as the MPI user
    assert manifest["source"] == url.rsplit("/", 1)[0] and manifest["source_version"] == "v1", manifest
    assert not (dataset / "journal.jsonl").exists()  # no unfinished sync left
    total = sum(e["size"] for e in manifest["files"])
    # Two workers on one node, one copy: every data file was sent once.
    assert sum(data_served().values()) == total, (data_served(), total)
    first = json.loads((dataset / "last-sync.json").read_text())
    synced_at, manifest_mtime = manifest["synced_at"], (dataset / "manifest.json").stat().st_mtime_ns
    used = (dataset / "last-used").stat().st_mtime_ns

    served_before = dict(data_served())
    # The second job goes through real Kueue (`kubernetes.queue`; the ClusterQueue's quota is the node's 2 CPUs,
    # which the job fills): created suspended, admitted, trained, Workload Finished. Under Kueue the operator
    # starts the launcher together with the workers, not after they are Ready (docs/k8s-stack.md section 4,
    # difference 0): the launcher's own wait for the workers' sshd keeps mpirun from racing them.
    node.kubectl("apply", "-f", "-", input=QUEUES)
    run("digits-cached-again", 1, "--set", "kubernetes.queue=team")  # from the node's copy; 1 epoch shows it
    again = json.loads((dataset / "last-sync.json").read_text())
    assert again["files_missed"] == 0 and again["bytes_copied"] == 0, (first, again)
    assert again["files_hit"] == len(manifest["files"]), again
    assert json.loads((dataset / "manifest.json").read_text())["synced_at"] == synced_at
    assert (dataset / "manifest.json").stat().st_mtime_ns == manifest_mtime
    assert data_served() == served_before, "the second job fetched data files again"
    assert (dataset / "last-used").stat().st_mtime_ns > used  # the sync recorded the reuse (LRU)
    assert [d.name for d in node_cache.iterdir() if not d.name.startswith(".")] == [dataset.name]
