"""A JobSpec rendered as the Kubernetes objects that run it: a ConfigMap carrying the job file and a
Kubeflow MPIJob (kubeflow.org/v2beta1), as plain dicts, and as deterministic YAML for GitOps.

Each object or part is built by one small function, in the spirit of mpi-operator's controller. The
operator adds the rest at run time: the hostfile and discover_hosts.sh ConfigMap (/etc/mpi), the SSH
keys (mounted at sshAuthMountPath), the launcher Job and the worker Pods.

The launcher waits for every worker's sshd (hvdk8s.launch.workers), then starts the ranks with `mpirun`
through SSH into the workers, so they do not see the worker pods' environment: every variable they need
is set on the launcher and forwarded (-x; see `environment`). A valid job file that cannot run on a
cluster as written (`checks`) is refused with its field paths before anything is rendered.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from hvdk8s import compression
from hvdk8s.gloo import GLOO_TIMEOUT_SECONDS
from hvdk8s.core import layout, safeyaml
from hvdk8s.core.atomic import atomic_write_all, fsync_dir
from hvdk8s.core.errors import UserError
from hvdk8s.entrypoint import PYTHON_IN_IMAGE, cluster_argv
from hvdk8s.spec import JobSpec, dump_job, with_backend_defaults

from . import cache, checks, monitoring, network, podsecurity, scheduling, security, volumes
from .api import API_VERSION, KIND, LAUNCHER, WORKER
from .environment import JOB_FILE, forwarded, rank_env  # noqa: F401  (rank_env: part of this module's API)
from .topology import Topology, plan

SSH_PORT = 2222
JOB_DIR = layout.JOB_DIR
MPI_USER_HOME = layout.MPI_USER_HOME
# The image's sshd, run by the non-root MPI user with its own config (see Dockerfile.gpu).
SSHD_COMMAND = ["/usr/sbin/sshd", "-De", "-f", f"{MPI_USER_HOME}/.sshd_config"]
LAUNCHER_RESOURCES = {"cpu": "1", "memory": "2Gi"}  # mpirun only; no GPU
# horovodrun blacklists the host of a rank that failed, by name, for good unless given a cooldown; the
# operator recreates a lost worker pod under the same DNS name, which must be able to join again (the first
# retry after 10-15 s, doubling up to 5 min; found on the real operator: docs/k8s-stack.md).
BLACKLIST_COOLDOWN_SECONDS = (5, 300)
LABEL_JOB, LABEL_ROLE = "hvdk8s.io/job", "hvdk8s.io/role"
POD_SECURITY_ANNOTATION = "hvdk8s.io/pod-security"  # the strictest Pod Security level all of the job's pods meet
FILES = ("configmap.yaml", "mpijob.yaml")
POD_MONITOR_FILE = "podmonitor.yaml"  # written (and listed) only for a job with a PodMonitor


def render(spec: JobSpec, files: Mapping[str, str] = {}) -> list[dict[str, Any]]:
    """The objects to apply, in apply order: the job-file ConfigMap, then the MPIJob, then (with
    observability.metrics.pod_monitor) the PodMonitor. `files` are carried in the ConfigMap beside the
    job (the entrypoint script: `hvdk8s.entrypoint.carried_files`). A job that cannot run on a cluster
    as written raises `checks.ClusterJobError` (a JobFileError)."""
    objects = [job_configmap(spec, files), mpijob(spec)]
    if monitoring.wants_pod_monitor(spec):
        objects.append(pod_monitor(spec))
    return objects


def job_configmap(spec: JobSpec, files: Mapping[str, str] = {}) -> dict[str, Any]:
    e = spec.entrypoint
    if e is not None and e.carried and e.script_name not in files:
        raise ValueError(f"entrypoint.script: the text of {e.script_name} is needed to carry it in the ConfigMap")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(spec, f"{spec.name}-job"),
            # As the ranks must read it on a cluster: what the file leaves to the back end decided (metrics on,
            # the compression `auto` picks).
            "data": {"job.yaml": dump_job(handed_to_ranks(spec)), **dict(sorted(files.items()))}}


def handed_to_ranks(spec: JobSpec) -> JobSpec:
    """The job as its ranks read it from the ConfigMap: the back end's defaults, and `compression: auto`
    resolved as the ranks would resolve it (fp16 across more than one worker: each worker pod is a host
    to Horovod), so the YAML shows what the job runs with. An elastic job keeps `auto`: its worker count
    changes while it runs, and the ranks resolve it at each start."""
    handed = with_backend_defaults(spec, cluster=True)
    t = handed.training
    if t.compression != "auto" or t.elastic is not None:
        return handed
    chosen = compression.resolve("auto", nodes=plan(spec.resources).workers)
    return handed.model_copy(update={"training": t.model_copy(update={"compression": chosen})})


def mpijob(spec: JobSpec) -> dict[str, Any]:
    checks.raise_for(spec)
    topo = plan(spec.resources)
    k8s = spec.kubernetes
    metadata = _metadata(spec, spec.name)
    if k8s.queue:
        metadata["labels"]["kueue.x-k8s.io/queue-name"] = k8s.queue
    metadata["annotations"] = {POD_SECURITY_ANNOTATION: podsecurity.job_level(spec)}
    # Never: each retry of a failed launcher is a new pod, and the Job keeps the failed ones, so their logs (what
    # `hvdk8s logs` and `wait` read the failing rank from) outlive the job; OnFailure restarts the container in
    # place, and the Job controller deletes that pod, log and all, when it gives up.
    replicas: dict[str, Any] = {
        LAUNCHER: {"replicas": 1, "restartPolicy": "Never", "template": launcher_template(spec, topo)}}
    if not k8s.run_launcher_as_worker:  # the operator's runLauncherAsWorker jobs may have no Worker at all
        replicas[WORKER] = {"replicas": topo.workers, "restartPolicy": "OnFailure",
                            "template": worker_template(spec, topo)}
    job_spec: dict[str, Any] = {
        "slotsPerWorker": topo.slots_per_worker,
        "runPolicy": run_policy(spec, topo),
        "mpiImplementation": "OpenMPI",
        "launcherCreationPolicy": scheduling.launcher_creation_policy(spec),
        "sshAuthMountPath": layout.SSH_AUTH_MOUNT,
    }
    if k8s.run_launcher_as_worker:
        job_spec["runLauncherAsWorker"] = True
    job_spec["mpiReplicaSpecs"] = replicas
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": job_spec}


def run_policy(spec: JobSpec, topo: Topology) -> dict[str, Any]:
    k8s = spec.kubernetes
    policy: dict[str, Any] = {"cleanPodPolicy": k8s.clean_pod_policy}
    for key, value in (("ttlSecondsAfterFinished", k8s.ttl_seconds_after_finished),
                       ("backoffLimit", k8s.backoff_limit),
                       ("activeDeadlineSeconds", k8s.active_deadline_seconds),
                       ("schedulingPolicy", scheduling.gang(spec, topo))):
        if value is not None:
            policy[key] = value
    if k8s.queue:
        policy["suspend"] = True  # Kueue admits (unsuspends) it when the queue has room
    return policy


def launcher_command(spec: JobSpec, topo: Topology) -> list[str]:
    """Wait for every worker's sshd (bounded), then mpirun the ranks over them; an elastic job's
    horovodrun instead (`elastic_command`)."""
    if spec.training.elastic is not None:
        return elastic_command(spec, topo)
    wait = [PYTHON_IN_IMAGE, "-m", "hvdk8s.launch.workers", "--port", str(SSH_PORT),
            "--timeout", str(spec.kubernetes.worker_wait_seconds), "--"]
    cmd = ["mpirun", "-np", str(topo.ranks), "-bind-to", "none", "-map-by", "slot",
           "-mca", "pml", "ob1", "-mca", "btl", "^openib", *network.mpirun_interface_args()]
    for name in forwarded(spec, topo):
        cmd += ["-x", name]
    cmd += network.rank_prefix(spec.resources.rdma)
    if spec.entrypoint is not None:
        return wait + cmd + cluster_argv(spec, JOB_DIR)
    return wait + cmd + ["hvdk8s", "train", JOB_FILE]


def elastic_command(spec: JobSpec, topo: Topology) -> list[str]:
    """horovodrun in elastic mode (Gloo, over the workers' sshd; through hvdk8s.launch.horovodrun, whose
    discovery polls cost a third of the script's): it starts on the workers that answer and
    re-reads them every second from the operator's discover_hosts.sh, filtered to those whose sshd
    answers (hvdk8s.launch.discovery). Change the MPIJob's Worker replicas (within training.elastic's
    bounds) to scale; a lost worker pod is recreated by the operator and joins again. horovodrun waits
    up to worker_wait_seconds for the minimum. It forwards the launcher's environment to every rank."""
    e, slots = spec.training.elastic, topo.slots_per_worker
    discovery = " ".join([PYTHON_IN_IMAGE, "-m", "hvdk8s.launch.discovery", "--port", str(SSH_PORT),
                          "--slots", str(slots), "/etc/mpi/discover_hosts.sh"])
    cmd = [PYTHON_IN_IMAGE, "-m", "hvdk8s.launch.horovodrun", "-np", str(topo.ranks),
           "--min-np", str(e.min_workers * slots), "--max-np", str(e.max_workers * slots), "--slots", str(slots),
           "--host-discovery-script", discovery,
           "--gloo", "--network-interfaces", network.MPI_INTERFACE, "--ssh-port", str(SSH_PORT),
           "--elastic-timeout", str(spec.kubernetes.worker_wait_seconds),
           "--blacklist-cooldown-range", *map(str, BLACKLIST_COOLDOWN_SECONDS),
           "--gloo-timeout-seconds", str(GLOO_TIMEOUT_SECONDS)]
    cmd += network.rank_prefix(spec.resources.rdma)
    if spec.entrypoint is not None:
        return cmd + cluster_argv(spec, JOB_DIR)
    return cmd + ["hvdk8s", "train", JOB_FILE]


def launcher_template(spec: JobSpec, topo: Topology) -> dict[str, Any]:
    if spec.kubernetes.run_launcher_as_worker:
        # The launcher pod is the job's one worker: its resources, volumes and placement, and mpirun starts the
        # ranks locally (OpenMPI sees its own hostfile entry as this host), so neither sshd nor a probe.
        template = worker_template(spec, topo)
        worker = template["spec"]["containers"][0]
        ports = monitoring.container_ports(spec)  # its ranks' metrics (and no sshd)
        launcher = {"name": "launcher", "image": spec.image, "imagePullPolicy": spec.kubernetes.image_pull_policy,
                    "command": launcher_command(spec, topo), "env": _env(spec, topo),
                    **({"ports": ports} if ports else {}),
                    **{key: worker[key] for key in ("resources", "securityContext", "volumeMounts")}}
        template["spec"]["containers"] = [launcher]
        template["metadata"]["labels"] = _labels(spec, "launcher")
        del template["spec"]["affinity"]
        return template
    container = {
        "name": "launcher", "image": spec.image, "imagePullPolicy": spec.kubernetes.image_pull_policy,
        "command": launcher_command(spec, topo),
        "env": _env(spec, topo),
        "resources": {"requests": dict(LAUNCHER_RESOURCES), "limits": dict(LAUNCHER_RESOURCES)},
        "securityContext": security.container(),
    }
    launcher_mounts = volumes.mounts(spec, launcher=True)
    if launcher_mounts:
        container["volumeMounts"] = launcher_mounts
    pod = _pod_spec(spec, [container], volumes.pod_volumes(spec, launcher=True))
    pod.update(scheduling.launcher_placement(spec))
    return {"metadata": {"labels": _labels(spec, "launcher")}, "spec": pod}


def worker_template(spec: JobSpec, topo: Topology) -> dict[str, Any]:
    rdma = spec.resources.rdma
    amounts = {"cpu": spec.resources.cpu, "memory": spec.resources.memory, **network.worker_resources(rdma)}
    if topo.gpus_per_worker:
        amounts["nvidia.com/gpu"] = str(topo.gpus_per_worker)
    cached = spec.cached_dataset is not None
    container = {
        "name": "worker", "image": spec.image, "imagePullPolicy": spec.kubernetes.image_pull_policy,
        "command": list(SSHD_COMMAND),
        "ports": [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}, *monitoring.container_ports(spec)],
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "initialDelaySeconds": 2, "periodSeconds": 5},
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},  # Guaranteed QoS
        "securityContext": security.container(),
        "volumeMounts": [{"name": layout.SHM_VOLUME, "mountPath": layout.SHM_DIR},
                         {"name": layout.JOB_VOLUME, "mountPath": JOB_DIR, "readOnly": True},
                         *([cache.cache_mount(spec)] if cached else []),
                         *volumes.mounts(spec)],
    }
    pod_volumes = [
        {"name": layout.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": layout.JOB_VOLUME, "configMap": {"name": f"{spec.name}-job"}},
        *cache.pod_volumes(spec, with_source=False),  # only with a cached dataset: a hostPath, synced once per node
        *volumes.pod_volumes(spec),
    ]
    pod = _pod_spec(spec, [container], pod_volumes)
    sync_resources = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    inits = cache.init_containers(spec, {"requests": dict(sync_resources), "limits": dict(sync_resources)})
    if inits:
        pod["initContainers"] = inits
    pod["affinity"] = scheduling.spread_workers(_labels(spec, "worker"), topo)
    pod.update(scheduling.worker_placement(spec, topo))
    template: dict[str, Any] = {"metadata": {"labels": _labels(spec, "worker")}, "spec": pod}
    annotations = {**network.worker_annotations(rdma), **monitoring.pod_annotations(spec)}
    if annotations:
        template["metadata"]["annotations"] = annotations
    return template


def worker_placement(spec: JobSpec, topo: Topology) -> dict[str, Any]:
    """nodeSelector and tolerations of the nodes a job's workers (and its cache warm-up) use."""
    return scheduling.worker_placement(spec, topo)


def warm_daemonset(spec: JobSpec) -> dict[str, Any]:
    """The DaemonSet that pre-fills the node-local dataset cache on the job's nodes."""
    checks.raise_for(spec)
    return cache.warm_daemonset(spec, worker_placement(spec, plan(spec.resources)))


def pod_monitor(spec: JobSpec) -> dict[str, Any]:
    """The Prometheus Operator's PodMonitor of the pods that run the job's ranks: the workers, or the
    launcher with run_launcher_as_worker (a plain launcher runs mpirun only, and declares no metrics port)."""
    role = "launcher" if spec.kubernetes.run_launcher_as_worker else "worker"
    return monitoring.pod_monitor(spec, _metadata(spec, spec.name), {"matchLabels": _labels(spec, role)})


def _pod_spec(spec: JobSpec, containers: list, pod_volumes: list) -> dict[str, Any]:
    k8s = spec.kubernetes
    pod: dict[str, Any] = {"securityContext": security.pod(k8s), "containers": containers}
    if pod_volumes:
        pod["volumes"] = pod_volumes
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    if k8s.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in k8s.image_pull_secrets]
    pod.update(scheduling.priority_and_scheduler(spec))
    return pod


def _env(spec: JobSpec, topo: Topology) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(rank_env(spec, topo).items())]
    env += [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
            for name, ref in sorted(spec.kubernetes.secret_env.items())]
    return env


def _labels(spec: JobSpec, role: str) -> dict[str, str]:
    return {LABEL_JOB: spec.name, LABEL_ROLE: role}


def _metadata(spec: JobSpec, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.kubernetes.namespace,
            "labels": {"app.kubernetes.io/managed-by": "hvdk8s", LABEL_JOB: spec.name}}


def kustomization(spec: JobSpec) -> dict[str, Any]:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "namespace": spec.kubernetes.namespace, "resources": _files(spec)}


def _files(spec: JobSpec) -> list[str]:
    """The object files of a rendered directory, in apply order (one per object `render` returns)."""
    return [*FILES, *([POD_MONITOR_FILE] if monitoring.wants_pod_monitor(spec) else [])]


# --- deterministic YAML ---------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    """Block style, no anchors/aliases, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Objects as one YAML stream: keys in the order built, no timestamps or random names."""
    return "---\n".join(yaml.dump(o, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
                        for o in objects)


def write_directory(spec: JobSpec, directory: str | os.PathLike, files: Mapping[str, str] = {}) -> list[Path]:
    """Write configmap.yaml, mpijob.yaml (podmonitor.yaml with a PodMonitor) and kustomization.yaml.
    Nothing is written unless all of them render, and none is replaced unless all were written whole
    (a full disk leaves the old set). A podmonitor.yaml that an earlier render wrote goes once the job
    has no PodMonitor; no other file in `directory` is touched."""
    objects = render(spec, files)
    contents = {name: to_yaml([obj]) for name, obj in zip(_files(spec), objects, strict=True)}
    contents["kustomization.yaml"] = to_yaml([kustomization(spec)])
    out = Path(directory)  # everything is rendered above, before the first byte is written
    try:
        out.mkdir(parents=True, exist_ok=True)
        blocked = [name for name in contents if (out / name).is_dir()]
        if blocked:  # found before writing, so no file of the set is replaced alone
            raise IsADirectoryError(21, "is a directory", str(out / blocked[0]))
        # 0644: GitOps tools and reviewers read these files.
        atomic_write_all({out / name: text for name, text in contents.items()})
        stale = out / POD_MONITOR_FILE  # an earlier render's, for a job that had a PodMonitor
        if POD_MONITOR_FILE not in contents and _rendered_pod_monitor(stale):
            stale.unlink()
            fsync_dir(out)
    except OSError as e:
        where = e.filename or out
        raise UserError(f"--output-dir {directory}: cannot write {where}: {e.strerror or e}") from None
    return [out / name for name in contents]


def _rendered_pod_monitor(path: Path) -> bool:
    """Whether `path` is a PodMonitor that render wrote (a file of the user's of that name stays)."""
    try:
        docs = safeyaml.read(path)
    except (OSError, safeyaml.YAMLInputError):
        return False
    doc = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else {}
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    labels = metadata.get("labels") if isinstance(metadata.get("labels"), dict) else {}
    return doc.get("kind") == "PodMonitor" and labels.get("app.kubernetes.io/managed-by") == "hvdk8s"
