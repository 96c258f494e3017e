"""A real Kubernetes API server for the cluster tests, and the parts of a cluster it lacks.

`own_cluster` starts etcd + kube-apiserver v1.20.2 (and the garbage collector) on 127.0.0.1 with
scripts/k8s/start.sh (building the binaries first if this machine has none) and installs the MPIJob CRD
from ../shared/k8s/mpijob-crd.yaml.
With HVDK8S_TEST_KUBECONFIG set, the tests run against that cluster instead (e.g. kind with mpi-operator);
the tests that stop the API server, swap its CRD, log in as the rights-less user or serve a node's
kubelet endpoint then skip, as they need the project's own server.

There is no mpi-operator, kubelet or scheduler in the project's cluster, and kube-controller-manager runs
its garbage collector alone (ownerReferences cascade as on any cluster). So the tests play the rest where
a test needs them, and say so: `Operator` writes an MPIJob's status subresource through the transitions
mpi-operator makes, and `kubelet.FakeKubelet` serves the container-log endpoint to which the API server
proxies `pods/log`. On another cluster where a real mpi-operator runs (`operator_in`), the tests that
write status skip (fixture `no_operator`): the operator would overwrite what they write.
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "k8s"
SHARED_CRD = ROOT.parent / "shared" / "k8s" / "mpijob-crd.yaml"
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
ADMIN, NOBODY = "hvdk8s-test", "hvdk8s-test-nobody"  # contexts start.sh writes


@dataclass
class Cluster:
    kubeconfig: Path
    own: bool  # the project's own API server (False: HVDK8S_TEST_KUBECONFIG's cluster)
    state: Optional[Path] = None  # start.sh's folder (own only)
    operator: Optional[str] = None  # where a real mpi-operator runs (`operator_in`), None: nowhere

    def env(self, context: Optional[str] = None) -> dict[str, str]:
        """Environment for a CLI run against this cluster (pyc written: each run imports the client anew)."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.pop("HVDK8S_EVENTS", None)
        return env

    def cli(self, *args: Any, timeout: float = 120, context: Optional[str] = None,
            kubeconfig: Optional[str] = None) -> subprocess.CompletedProcess:
        """`hvdk8s ARGS` as a user runs it, with KUBECONFIG naming this cluster (or `kubeconfig`: a path,
        or paths joined with ':' as kubectl merges them)."""
        env = self.env(context)
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return subprocess.run([sys.executable, "-m", "hvdk8s", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, env=env)

    def popen(self, *args: Any) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "hvdk8s", *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT, env=self.env())

    def kubectl(self, *args: Any, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
        """kubectl, for the tests' own set-up and inspection (the product uses the Python client)."""
        proc = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *map(str, args)],
                              capture_output=True, text=True, timeout=120, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(map(str, args))} failed: {proc.stderr}")
        return proc

    def api(self):
        """An admin ApiClient (the tests' own, for reading what the CLI made and for playing the operator)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg, persist_config=False)
        return client.ApiClient(cfg)

    def stop_apiserver(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "stop.sh"), str(self.state), "--apiserver-only"], check=True,
                       capture_output=True, timeout=60)

    def start_apiserver(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "start.sh"), str(self.state), "--apiserver-only"], check=True,
                       capture_output=True, timeout=120)

    def install_crd(self, text: str) -> None:
        """Create a CRD from YAML text and wait until it is served."""
        names = self.kubectl("create", "-f", "-", "-o", "name", input=text).stdout.split()
        established = "{.status.conditions[?(@.type==\"Established\")].status}"
        for _ in range(240):  # Established, then listed by discovery too
            if all(self.kubectl("get", n, "-o", f"jsonpath={established}", check=False).stdout == "True"
                   and self.kubectl("get", n.split("/", 1)[1], "-A", check=False).returncode == 0 for n in names):
                return
            time.sleep(0.25)
        raise AssertionError(f"{names} not served after 60s")

    def delete_crd(self, name: str = f"{PLURAL}.{GROUP}") -> None:
        self.kubectl("delete", "crd", name, "--ignore-not-found", "--wait", "--timeout", "60s")
        for _ in range(120):  # gone from discovery too
            if self.kubectl("get", name, "-A", check=False).returncode != 0:
                return
            time.sleep(0.25)


def own_cluster(state: Path) -> Cluster:
    """Start the project's API server in `state` (stop it with `stop`)."""
    proc = subprocess.run(["bash", str(SCRIPTS / "start.sh"), str(state), "--crd", str(SHARED_CRD)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:  # (start.sh stopped what it had started)
        raise RuntimeError(f"scripts/k8s/start.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Cluster(kubeconfig=Path(proc.stdout.strip().splitlines()[-1]), own=True, state=state)


def stop(cluster: Cluster) -> None:
    if cluster.own and cluster.state is not None:
        subprocess.run(["bash", str(SCRIPTS / "stop.sh"), str(cluster.state)], capture_output=True, timeout=120)


def job_objects(cluster: Cluster, namespace: str, name: str) -> tuple[Optional[dict], Optional[dict]]:
    """The job's MPIJob and ConfigMap (`NAME-job`) as the server has them, None where absent."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = cluster.api()
    try:
        job = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        assert e.status == 404
        job = None
    try:
        cm = api.sanitize_for_serialization(client.CoreV1Api(api).read_namespaced_config_map(f"{name}-job", namespace))
    except ApiException as e:
        assert e.status == 404
        cm = None
    return job, cm


def operator_in(cluster: Cluster) -> Optional[str]:
    """Where a real mpi-operator runs in the cluster: HVDK8S_TEST_OPERATOR=1 says so, else a Deployment
    named mpi-operator in any namespace this user may list; None when neither (or it may not list them)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    if os.environ.get("HVDK8S_TEST_OPERATOR") == "1":
        return "HVDK8S_TEST_OPERATOR=1"
    try:
        found = client.AppsV1Api(cluster.api()).list_deployment_for_all_namespaces(
            field_selector="metadata.name=mpi-operator", _request_timeout=30).items
    except ApiException as e:
        if e.status == 403:
            return None
        raise
    return f"deployment mpi-operator in namespace {found[0].metadata.namespace}" if found else None


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Operator:
    """Plays mpi-operator's part in a test: writes an MPIJob's status subresource as its controller
    does on each transition (conditions with its reasons and messages, replicaStatuses, times)."""

    def __init__(self, api, namespace: str, name: str):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.name = namespace, name
        self.conditions: list[dict] = []
        self.times: dict[str, str] = {}

    def _condition(self, kind: str, status: str, reason: str, message: str) -> None:
        self.conditions = [c for c in self.conditions if c["type"] != kind]
        self.conditions.append({"type": kind, "status": status, "reason": reason, "message": message,
                                "lastUpdateTime": _now(), "lastTransitionTime": _now()})

    def _write(self, replicas: dict, **times: str) -> None:
        # The whole status at once, as the operator's UpdateStatus writes it.
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        self.times.update(times)
        job["status"] = {"conditions": self.conditions, "replicaStatuses": replicas, **self.times}
        self.custom.replace_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.name, job)

    def created(self) -> None:
        self._condition("Created", "True", "MPIJobCreated", f"MPIJob {self.namespace}/{self.name} is created.")
        self._write({"Launcher": {}, "Worker": {}})

    def running(self, workers: int = 1) -> None:
        self._condition("Running", "True", "MPIJobRunning", f"MPIJob {self.namespace}/{self.name} is running.")
        self._write({"Launcher": {"active": 1}, "Worker": {"active": workers}}, startTime=_now())

    def succeeded(self) -> None:
        self._condition("Running", "False", "MPIJobSucceeded", f"MPIJob {self.namespace}/{self.name} successfully "
                                                                "completed.")
        self._condition("Succeeded", "True", "MPIJobSucceeded", f"MPIJob {self.namespace}/{self.name} successfully "
                                                                 "completed.")
        self._write({"Launcher": {"succeeded": 1}, "Worker": {}}, completionTime=_now())

    def failed(self, message: str) -> None:
        self._condition("Running", "False", "MPIJobFailed", message)
        self._condition("Failed", "True", "MPIJobFailed", message)
        self._write({"Launcher": {"failed": 1}, "Worker": {}}, completionTime=_now())
