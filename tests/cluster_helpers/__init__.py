"""A real Kubernetes for the cluster tests, and the one part of a node it lacks.

`own_cluster` starts Kubernetes 1.35 on 127.0.0.1 with scripts/k8s/start-135.sh (building it first if
this machine has none): etcd, kube-apiserver (PodSecurity admission on), kube-controller-manager (job,
garbage-collector, namespace, endpointslice, serviceaccount and node-lifecycle controllers),
kube-scheduler, the real mpi-operator v0.8.x with the MPIJob CRD from its module, real Kueue, and kwok
with NODES fake nodes. So an MPIJob goes through the real operator: it makes the worker pods, the
scheduler binds them to kwok's nodes, kwok marks them Running and Ready, the operator creates the
launcher Job, the job controller its pod, and the operator writes the MPIJob's status from all that.
What kwok cannot do, a test does, and says so:
- a container ends when the test says: kwok's pod stages here are its module's own, except that a pod
  completes only once it carries the annotation EXIT_CODE (`end_container`): exit code 0 makes it
  Succeeded, any other Failed (kwok's stock stage completes every Job pod a second after it started);
- containers write no logs: kwok's nodes advertise `kubelet.FakeKubelet` as their kubelet endpoint, which
  serves each container's log from lines the test writes.
With HVDK8S_TEST_KUBECONFIG set, the tests run against that cluster instead (e.g. kind with
mpi-operator); the tests that need the project's own cluster (they stop its API server, swap its CRD,
log in as its rights-less user, end containers through kwok or write their logs) then skip.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from hvdk8s.mpijob.api import GROUP, PLURAL, VERSION  # noqa: F401  (the cluster tests import them from here)

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "k8s"
ADMIN, NOBODY = "hvdk8s-test", "hvdk8s-test-nobody"  # contexts start-135.sh writes
NODES, NODE_GPUS = 4, 8  # kwok's fake nodes (32 CPUs, 256Gi, NODE_GPUS nvidia.com/gpu, 1 rdma/ib each)
EXIT_CODE = "hvdk8s.test/exit-code"  # the annotation on which kwok ends a pod's containers (with this code)


def api_client(kubeconfig: Path):
    """An ApiClient of the tests' own for the kubeconfig's current context (not through hvdk8s's code)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg, persist_config=False)
    return client.ApiClient(cfg)


@dataclass
class Cluster:
    kubeconfig: Path
    own: bool  # the project's own API server (False: HVDK8S_TEST_KUBECONFIG's cluster)
    state: Optional[Path] = None  # start-135.sh's folder (own only)
    operator: Optional[str] = None  # where a real mpi-operator runs (`operator_in`), None: nowhere
    kubelet: Any = None  # the log endpoint of kwok's nodes (kubelet.FakeKubelet; own only)
    crd: Optional[Path] = None  # the MPIJob CRD the cluster was given (own only)

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
        """An admin ApiClient (the tests' own, for reading what the CLI made and for ending containers)."""
        return api_client(self.kubeconfig)

    def stop_apiserver(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "stop-135.sh"), str(self.state), "--apiserver-only"], check=True,
                       capture_output=True, timeout=60)

    def start_apiserver(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "start-135.sh"), str(self.state), "--apiserver-only"], check=True,
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


def built() -> Path:
    """The folder of the 1.35 stack's binaries (scripts/k8s/build-135.sh builds them once per machine)."""
    proc = subprocess.run(["bash", str(SCRIPTS / "build-135.sh")], capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/k8s/build-135.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def kwok_stages(stock: str) -> str:
    """kwok's stock stages, but a pod completes only when the test ends it (EXIT_CODE), with that code, and
    each pod stage is taken after 100 ms: the stock ones wait 1 s plus up to 5 s of random jitter, to look like
    a real kubelet, which kept every scheduled pod Pending for 4-9 s and cost the cluster tests minutes of
    waiting (kwok-node-0's worker Running 6 s after it was bound, measured)."""
    stages = [d for d in yaml.safe_load_all(stock) if d]
    for stage in stages:
        delay = stage["spec"].get("delay")
        if delay and stage["spec"]["resourceRef"]["kind"] == "Pod":
            delay["durationMilliseconds"] = min(delay.get("durationMilliseconds", 0), 100)
            delay.pop("jitterDurationMilliseconds", None)
            delay.pop("jitterDurationFrom", None)
    complete = next(d for d in stages if d["metadata"]["name"] == "pod-complete")
    spec = complete["spec"]
    spec["selector"]["matchExpressions"] = [
        e for e in spec["selector"]["matchExpressions"] if e["key"] != ".metadata.ownerReferences.[].kind"
    ] + [{"key": f'.metadata.annotations["{EXIT_CODE}"]', "operator": "Exists"}]
    spec["delay"] = {"durationMilliseconds": 0}
    template = spec["next"]["statusTemplate"]
    for stock_text, ours in (("exitCode: 0", "exitCode: {{ $code }}"),
                             ("reason: Completed", "reason: {{ if eq $code \"0\" }}Completed{{ else }}Error{{ end }}"),
                             ("phase: Succeeded", "phase: {{ if eq $code \"0\" }}Succeeded{{ else }}Failed{{ end }}")):
        assert stock_text in template, f"kwok's pod-complete stage changed: no {stock_text!r}"
        template = template.replace(stock_text, ours)
    spec["next"]["statusTemplate"] = f'{{{{ $code := index .metadata.annotations "{EXIT_CODE}" }}}}\n' + template
    return yaml.safe_dump_all(stages, sort_keys=False)


def own_cluster(state: Path, kubelet) -> Cluster:
    """Start the project's cluster in `state` (stop it with `stop`); kwok's nodes advertise `kubelet`."""
    bin_dir = built()
    stages = state / "kwok-stages.yaml"
    stages.write_text(kwok_stages((bin_dir.parent / "kwok" / "stages.yaml").read_text()))
    proc = subprocess.run(["bash", str(SCRIPTS / "start-135.sh"), str(state), "--kwok-nodes", str(NODES),
                           "--node-gpus", str(NODE_GPUS), "--kwok-stages", str(stages),
                           "--kwok-node-port", str(kubelet.port), "--kueue"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:  # (start-135.sh stopped what it had started)
        raise RuntimeError(f"scripts/k8s/start-135.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    kubelet.serve(state / "certs")
    version = subprocess.run([str(bin_dir / "mpi-operator"), "--version"], capture_output=True, text=True).stdout
    return Cluster(kubeconfig=Path(proc.stdout.strip().splitlines()[-1]), own=True, state=state,
                   operator=f"mpi-operator {version.split()[1] if version else '?'} (the project's cluster)",
                   kubelet=kubelet, crd=bin_dir.parent / "crd" / "kubeflow.org_mpijobs.yaml")


def stop(cluster: Cluster) -> None:
    if cluster.own and cluster.state is not None:
        subprocess.run(["bash", str(SCRIPTS / "stop-135.sh"), str(cluster.state)], capture_output=True, timeout=120)


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


def job_pods(cluster: Cluster, namespace: str, job: str, role: str) -> list:
    """The job's pods of `role` (launcher or worker), as mpi-operator labels them, oldest first."""
    from kubernetes import client

    pods = client.CoreV1Api(cluster.api()).list_namespaced_pod(
        namespace, label_selector=f"training.kubeflow.org/job-name={job},training.kubeflow.org/job-role={role}").items
    return sorted(pods, key=lambda p: p.metadata.creation_timestamp)


def running_launcher(cluster: Cluster, namespace: str, job: str, timeout: float = 300):
    """The job's launcher pod once it runs (kwok marked it Running) and no test has ended it yet."""
    deadline = time.monotonic() + timeout  # a watchdog; the launcher appears once the workers are Ready
    while True:
        for pod in job_pods(cluster, namespace, job, "launcher"):
            if pod.status.phase == "Running" and EXIT_CODE not in (pod.metadata.annotations or {}):
                return pod
        assert time.monotonic() < deadline, f"no running launcher of {namespace}/{job} within {timeout}s"
        time.sleep(0.1)


def end_container(cluster: Cluster, namespace: str, pod: str, code: int, log: list[str] = ()) -> None:
    """The pod's containers write `log` (to the kubelet endpoint of kwok's nodes) and exit with `code`."""
    from kubernetes import client

    for container in client.CoreV1Api(cluster.api()).read_namespaced_pod(pod, namespace).spec.containers:
        feed = cluster.kubelet.feed(namespace, pod, container.name)
        feed.write(*log)
        feed.close()
    client.CoreV1Api(cluster.api()).patch_namespaced_pod(pod, namespace,
                                                          {"metadata": {"annotations": {EXIT_CODE: str(code)}}})


def end_launcher(cluster: Cluster, namespace: str, job: str, code: int, log: list[str] = ()) -> str:
    """Wait for the job's launcher to run, then end it with `code` (see `end_container`); its pod's name."""
    pod = running_launcher(cluster, namespace, job).metadata.name
    end_container(cluster, namespace, pod, code, log)
    return pod


def wait_phase(cluster: Cluster, namespace: str, job: str, phase: str, timeout: float = 300) -> dict:
    """`hvdk8s status -o json` once the job's phase is `phase` (the operator gets there). Polled in this
    process with the phase the CLI computes (hvdk8s.launch.kubernetes.job_status on the MPIJob), then asked
    of the CLI itself: each `hvdk8s status` is a new Python process (0.65 CPU-s), and polling with it every
    0.2 s kept a core busy for as long as the job took."""
    import json

    from kubernetes import client

    from hvdk8s.launch.kubernetes import job_status

    custom = client.CustomObjectsApi(cluster.api())
    deadline = time.monotonic() + timeout  # a watchdog
    while True:
        seen = job_status(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)).phase
        if seen == phase:
            run = cluster.cli("status", job, "-n", namespace, "-o", "json")
            assert run.returncode == 0, run.stderr
            status = json.loads(run.stdout)
            if status["phase"] == phase:
                return status
            seen = status["phase"]  # moved on since (or back): poll again
        if time.monotonic() > deadline:
            raise AssertionError(f"{namespace}/{job} is {seen}, not {phase}, after {timeout}s\n"
                                 + diagnose(cluster.kubectl, namespace))
        time.sleep(0.2)


def diagnose(kubectl, namespace: str) -> str:
    """What a stuck job's namespace holds (its pods, Jobs and events) and the nodes' taints, for a failure
    message; `kubectl` is a cluster's own (Cluster.kubectl here, the node tests' Node.kubectl)."""
    seen = kubectl("get", "pods,jobs,events", "-n", namespace, "-o", "wide", check=False)
    taints = kubectl("get", "nodes", "-o", "custom-columns=NAME:.metadata.name,TAINTS:.spec.taints", check=False)
    return seen.stdout + seen.stderr + taints.stdout + taints.stderr
