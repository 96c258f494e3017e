"""The cluster back end of the launcher protocol: a job runs as the Kubeflow MPIJob (kubeflow.org/v2beta1)
and ConfigMap that `hvdk8s.mpijob.render` makes of it, through the official Kubernetes client.

`manifests` is the pure dry run (no cluster). `submit` checks first, then creates:
1. the cluster serves MPIJob v2beta1 (not the training-operator's v1, not nothing);
2. the namespace's Pod Security level (its pod-security.kubernetes.io/enforce label) admits the job's pods;
3. the MPIJob fits the CRD the cluster serves (hvdk8s's own rules where the CRD may not be read);
4. neither object exists yet: a second launch of a job is refused, never merged into the running one;
5. with observability.metrics.pod_monitor, the cluster serves PodMonitors (the Prometheus Operator's);
6. the MPIJob is created, then the ConfigMap (and the PodMonitor) with an ownerReference to it, so that
   deleting the job deletes them (the garbage collector does; `delete` also does it itself). If one
   cannot be created, what was made is deleted again: nothing is left half-applied.

A job's progress is what mpi-operator writes in the MPIJob's status: conditions and replicaStatuses.
Its output is the launcher pod's log (mpirun there carries every rank's output).
"""
from __future__ import annotations

import datetime as dt
import functools
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from hvdk8s.core.errors import UserError
from hvdk8s.entrypoint import carried_files
from hvdk8s.launch import logview
from hvdk8s.launch.base import Condition, JobStatus, WaitTimeout, phase_of
from hvdk8s.launch.kubeclient import TIMEOUT, ClusterError, Connection, connect, explain, status_body, translated
from hvdk8s.mpijob import podsecurity, validate as mv
from hvdk8s.mpijob.api import CRD_NAME, GROUP, KIND, PLURAL, VERSION
from hvdk8s.mpijob.monitoring import POD_MONITOR_API, POD_MONITOR_KIND, POD_MONITOR_PLURAL
from hvdk8s.mpijob.operator import OPERATOR_LABELS
from hvdk8s.mpijob.render import render

INSTALL_OPERATOR = ("install mpi-operator (kubectl apply --server-side -f https://raw.githubusercontent.com/"
                    "kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml)")
# mpi-operator labels the launcher's pods so (defaultLabels in its controller).
_, JOB_NAME_LABEL, JOB_ROLE_LABEL = OPERATOR_LABELS
LAUNCHER_SELECTOR = f"{JOB_NAME_LABEL}={{name}},{JOB_ROLE_LABEL}=launcher"
PM_GROUP, PM_VERSION = POD_MONITOR_API.split("/")
NO_POD_MONITORS = (f"serves no PodMonitors (no {POD_MONITOR_PLURAL}.{PM_GROUP} CRD, {POD_MONITOR_API}), which "
                   "observability.metrics.pod_monitor asks for; install the Prometheus Operator, or set "
                   "observability.metrics.pod_monitor: false")
POLL_S = 1.0  # while waiting for a launcher pod to appear or restart
WATCH_WINDOW_S = 300  # one watch request's length; the wait goes on across windows


def manifests(spec, job_dir: Optional[Path], source: str) -> list[dict[str, Any]]:
    """What `submit` sends, in order: the MPIJob, then the ConfigMap and (with a PodMonitor) the
    PodMonitor, which get an ownerReference to the MPIJob once the server has given it a uid."""
    configmap, job, *monitors = render(spec, carried_files(spec, job_dir, source))
    return [job, configmap, *monitors]


def job_status(obj: dict[str, Any]) -> JobStatus:
    """JobStatus of an MPIJob object as the API returns it."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    conditions = tuple(Condition(str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason") or ""),
                                 str(c.get("message") or ""), _time(c.get("lastTransitionTime")))
                       for c in status.get("conditions") or [] if isinstance(c, dict))
    replicas = {str(role): {k: int(counts.get(k) or 0) for k in ("active", "succeeded", "failed")}
                for role, counts in sorted((status.get("replicaStatuses") or {}).items()) if isinstance(counts, dict)}
    return JobStatus(name=meta.get("name", ""), phase=phase_of(conditions), namespace=meta.get("namespace"),
                     created=_time(meta.get("creationTimestamp")), conditions=conditions, replicas=replicas)


def _time(value: Any) -> Optional[dt.datetime]:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if not value:
        return None
    try:
        return dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None


class KubernetesLauncher:
    """The launcher verbs against one namespace of one cluster."""

    def __init__(self, conn: Connection, namespace: Optional[str] = None):
        from kubernetes import client

        self.conn = conn
        self.namespace = namespace or conn.namespace
        self.custom = client.CustomObjectsApi(conn.api)
        self.created: list[dict[str, Any]] = []  # what the last submit made, as the server returned it

    @functools.cached_property
    def core(self):
        """The core API, made when a verb first needs it: importing it builds some 280 pydantic models
        (kubernetes 37's client), 0.5-1 CPU-s that `status`, `list` and `wait` do not need."""
        from kubernetes import client

        return client.CoreV1Api(self.conn.api)

    @classmethod
    def connect(cls, context: Optional[str] = None, namespace: Optional[str] = None,
                kubeconfig: Optional[str] = None) -> "KubernetesLauncher":
        return cls(connect(context, kubeconfig), namespace)

    def _errors(self, namespace: Optional[str] = None):
        return translated(self.conn, namespace or self.namespace)

    # --- checks before anything is created ---------------------------------------------------------

    def served_versions(self) -> list[str]:
        """The versions of kubeflow.org in which this cluster serves MPIJobs."""
        from kubernetes import client

        groups = client.ApisApi(self.conn.api).get_api_versions(_request_timeout=TIMEOUT)
        group = next((g for g in groups.groups or [] if g.name == GROUP), None)
        found = []
        for version in (group.versions if group else []):
            resources = self.custom.get_api_resources(GROUP, version.version, _request_timeout=TIMEOUT)
            if any(r.name == PLURAL for r in resources.resources or []):
                found.append(version.version)
        return found

    def require_api(self) -> None:
        versions = self.served_versions()
        if not versions:
            raise ClusterError(f"the cluster at {self.conn.server} serves no MPIJobs (no {CRD_NAME} CRD); "
                               + INSTALL_OPERATOR)
        if VERSION not in versions:
            other = ", ".join(f"{GROUP}/{v}" for v in versions)
            whose = "the Kubeflow training-operator's API" if "v1" in versions else "an older mpi-operator's API"
            raise ClusterError(f"the cluster serves MPIJob as {other} ({whose}), not {GROUP}/{VERSION}, which "
                               f"hvdk8s makes; {INSTALL_OPERATOR} in its place")

    def require_pod_monitors(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            resources = self.custom.get_api_resources(PM_GROUP, PM_VERSION, _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status != 404:  # 404: the group/version is not served at all
                raise
            resources = None
        if not any(r.name == POD_MONITOR_PLURAL for r in (resources.resources or [] if resources else [])):
            raise ClusterError(f"the cluster at {self.conn.server} {NO_POD_MONITORS}")

    def require_pod_security(self, spec, namespace: str, source: str, on_note: Callable[[str], None]) -> None:
        """Refuse a job whose pods the namespace's Pod Security admission would reject (the operator would
        create the MPIJob, then fail to create its pods, with nothing but an Event to say why)."""
        from kubernetes.client.exceptions import ApiException

        if not podsecurity.requirements(spec):
            return  # restricted pods: every level admits them
        try:
            ns = self.core.read_namespace(namespace, _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status == 403:  # users may run jobs without the right to read namespaces
                on_note(f"may not read namespace {namespace}: its {podsecurity.ENFORCE_LABEL} label (the Pod "
                        "Security level it enforces) was not checked against this job's")
            if e.status in (403, 404):  # a missing namespace is reported where the job is created
                return
            raise
        enforced = (ns.metadata.labels or {}).get(podsecurity.ENFORCE_LABEL)
        if enforced not in podsecurity.LEVELS:
            return  # unlabelled (privileged, unless the cluster's default says otherwise) or not a level
        rejected = podsecurity.rejected_by(spec, enforced)
        if rejected:
            need = podsecurity.job_level(spec)
            raise UserError(f"{source}: namespace {namespace} enforces the {enforced} Pod Security level "
                            f"({podsecurity.ENFORCE_LABEL}={enforced}) and would reject this job's pods, which "
                            f"need {need}; nothing was created (use a namespace that allows {need})",
                            [(field, f"{why} (needs {level})") for level, field, why in rejected])

    def served_schema(self) -> Optional[dict]:
        """The v2beta1 schema of the MPIJob CRD the cluster serves; None where we may not read CRDs."""
        return mv.served_crd_schema(self.conn.api, VERSION, timeout=TIMEOUT)

    def require_schema(self) -> dict:
        """The served CRD's schema (`hvdk8s validate --crd-from-cluster`), or a one-line refusal."""
        with self._errors():
            schema = self.served_schema()
        if schema is None:
            raise ClusterError(f"may not read the {CRD_NAME} CRD of the cluster at {self.conn.server} (forbidden, or "
                               f"not installed); check against a copy of it instead: --crd FILE")
        return schema

    def check(self, job: dict[str, Any], source: str) -> Optional[str]:
        """Refuse the MPIJob unless it fits the served CRD; returns a note when hvdk8s's own rules stood in."""
        schema = self.served_schema()
        problems = mv.validate_mpijob(job, schema=schema, pod_schema=mv.pod_schema_available())
        if problems:
            against = "the MPIJob CRD this cluster serves" if schema else "hvdk8s's MPIJob rules"
            raise UserError(f"{source}: the MPIJob does not pass {against}; nothing was created",
                            [(p.path, p.message) for p in problems])
        return None if schema is not None else (f"may not read the {CRD_NAME} CRD here: checked against "
                                                "hvdk8s's own MPIJob rules")

    # --- the verbs ---------------------------------------------------------------------------------

    def submit(self, spec, job_dir: Optional[Path], source: str, on_note: Callable[[str], None] = lambda _: None) -> str:
        job, configmap, *monitors = manifests(spec, job_dir, source)
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        with self._errors(namespace):
            self.require_api()
            self.require_pod_security(spec, namespace, source, on_note)
            if monitors:
                self.require_pod_monitors()
            note = self.check(job, source)
            if note:
                on_note(note)
            self._refuse_existing(name, configmap["metadata"]["name"], namespace)
            created_job = self._create_job(job, namespace)
            made: list[dict[str, Any]] = []
            for obj in (configmap, *monitors):
                try:
                    made.append(self._create_owned(_owned_by(obj, created_job), namespace))
                except BaseException as e:
                    undone = self._undo_create(name, namespace, made)
                    if not _is_client_error(e):
                        raise  # Ctrl-C or a bug: what was made is gone again, the cause stays as it is
                    error = e if isinstance(e, ClusterError) else explain(e, self.conn, namespace)
                    raise ClusterError(f"creating {obj['kind'].lower()} {obj['metadata']['name']} failed: "
                                       f"{error.header}; " + undone, error.problems, status=error.status) from None
        self.created = [created_job, *made]
        return name

    def _create_owned(self, obj: dict, namespace: str) -> dict:
        """Create the ConfigMap or PodMonitor; returns it as the server does, as a dict."""
        if obj["kind"] == "ConfigMap":
            created = self.core.create_namespaced_config_map(namespace, obj, _request_timeout=TIMEOUT)
            return self.conn.api.sanitize_for_serialization(created)
        return self.custom.create_namespaced_custom_object(PM_GROUP, PM_VERSION, namespace, POD_MONITOR_PLURAL, obj,
                                                           _request_timeout=TIMEOUT)

    def _refuse_existing(self, name: str, configmap: str, namespace: str) -> None:
        from kubernetes.client.exceptions import ApiException

        existing = self._find(name, namespace)
        if existing is not None:
            raise _already_exists(job_status(existing), namespace)
        try:
            self.core.read_namespaced_config_map(configmap, namespace, _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        raise ClusterError(f"configmap {configmap} already exists in namespace {namespace} with no mpijob {name} "
                           f"(left by a GitOps apply or by hand?); remove it (`kubectl delete configmap {configmap} "
                           f"-n {namespace}`) or rename the job (--set name=...)")

    def _create_job(self, job: dict, namespace: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job,
                                                               _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status == 409:  # created by someone else since our look
                existing = self._find(job["metadata"]["name"], namespace)
                if existing is not None:
                    raise _already_exists(job_status(existing), namespace) from None
            raise

    def _undo_create(self, name: str, namespace: str, made: Sequence[dict] = ()) -> str:
        """Delete the MPIJob just created, and what `made` lists of the objects it owns (the garbage
        collector would, but not at once, and a cluster may run none); says whether that worked."""
        try:
            for obj in made:
                self._delete_owned(obj["kind"], obj["metadata"]["name"], namespace)
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                        propagation_policy="Background", _request_timeout=TIMEOUT)
            return " and ".join([f"mpijob {name}", *(f"{o['kind'].lower()} {o['metadata']['name']}" for o in made)]) \
                + f" {'was' if not made else 'were'} deleted again, nothing is left"
        except Exception as e:  # noqa: BLE001 - reported to the user, with the remedy
            reason = explain(e, self.conn, namespace).header if _is_client_error(e) else repr(e)
            return (f"deleting mpijob {name} again failed too ({reason}): remove it with "
                    f"`hvdk8s delete {name} -n {namespace}`")

    def _delete_owned(self, kind: str, name: str, namespace: str) -> None:
        if kind == "ConfigMap":
            self.core.delete_namespaced_config_map(name, namespace, _request_timeout=TIMEOUT)
        else:
            self.custom.delete_namespaced_custom_object(PM_GROUP, PM_VERSION, namespace, POD_MONITOR_PLURAL, name,
                                                        _request_timeout=TIMEOUT)

    def _find(self, name: str, namespace: Optional[str] = None) -> Optional[dict]:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace or self.namespace, PLURAL, name,
                                                            _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status == 404 and _details_kind(e) == PLURAL:
                return None
            if e.status == 404:
                self.require_api()  # the resource itself is not served: say which API is missing
            raise

    def _get(self, name: str) -> dict:
        obj = self._find(name)
        if obj is None:
            raise ClusterError(f"no mpijob {name} in namespace {self.namespace}; `hvdk8s list -n {self.namespace}` "
                               "shows the jobs there")
        return obj

    def status(self, name: str) -> JobStatus:
        with self._errors():
            return job_status(self._get(name))

    def list(self, all_namespaces: bool = False) -> list[tuple[JobStatus, dict]]:
        """Every MPIJob in the namespace (or all), oldest first, with its object."""
        from kubernetes.client.exceptions import ApiException

        with self._errors():
            try:
                if all_namespaces:
                    found = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=TIMEOUT)
                else:
                    found = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                                      _request_timeout=TIMEOUT)
            except ApiException as e:
                if e.status == 404:
                    self.require_api()
                raise
        items = [(job_status(o), o) for o in found.get("items") or []]
        return sorted(items, key=lambda item: (item[0].namespace or "", item[0].created or _EPOCH, item[0].name))

    def wait(self, name: str, timeout: Optional[float] = None,
             on_change: Optional[Callable[[JobStatus], None]] = None) -> JobStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Optional[JobStatus] = None
        with self._errors():
            for obj in self._changes(name, deadline):
                status = job_status(obj)
                if last is None or (status.phase, status.replicas) != (last.phase, last.replicas):
                    if on_change:
                        on_change(status)
                last = status
                if status.finished:
                    return status
        phase = last.phase if last else "unknown"
        ns = f" -n {self.namespace}"
        raise WaitTimeout(f"mpijob {name} is still {phase} after {timeout:g}s (it goes on running); wait longer "
                          f"(`hvdk8s wait {name}{ns} --timeout ...`), follow it (`hvdk8s logs -f {name}{ns}`) or "
                          f"stop it (`hvdk8s delete {name}{ns}`)")

    def _changes(self, name: str, deadline: Optional[float]) -> Iterator[dict]:
        """The job now, then each time it changes, until the deadline."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        obj = self._get(name)
        yield obj
        version = obj["metadata"]["resourceVersion"]
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            window = WATCH_WINDOW_S if left is None else max(1, min(WATCH_WINDOW_S, math.ceil(left)))
            w = watch.Watch()
            try:
                for event in w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                                      PLURAL, field_selector=f"metadata.name={name}", resource_version=version,
                                      timeout_seconds=window, _request_timeout=(TIMEOUT[0], window + 30)):
                    if event["type"] == "DELETED":
                        raise ClusterError(f"mpijob {name} was deleted while waiting for it")
                    if event["type"] in ("ADDED", "MODIFIED"):
                        obj = event["object"]
                        version = obj["metadata"]["resourceVersion"]
                        yield obj
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            except ApiException as e:
                if e.status != 410:
                    raise
                obj = self._get(name)  # our place in the history expired: start again from now
                version = obj["metadata"]["resourceVersion"]
                yield obj
            finally:
                w.stop()

    def logs(self, name: str, follow: bool = False) -> Iterator[str]:
        """The launcher's log; with `follow`, waits for the launcher to start, follows it (and any
        restarted launcher container or pod) until the job has finished."""
        with self._errors():
            status = job_status(self._get(name))
            if not follow:
                pod = self._launcher_pod(name)
                if pod is None:
                    raise ClusterError(f"mpijob {name} has no started launcher pod ({status.phase}); "
                                       f"`hvdk8s logs -f {name} -n {self.namespace}` waits for it")
                yield from self._pod_log(pod, follow=False)
                return
            followed: set[tuple[str, int]] = set()
            while True:
                pod = self._next_launcher(name, followed)
                if pod is None:
                    return
                followed.add(_run_key(pod))
                yield from self._pod_log(pod, follow=True)

    def first_failure(self, name: str):
        """The rank that failed first (`hvdk8s.failures.Failure`) as the log of the job's newest launcher run
        says it; None when it names none or cannot be read (no launcher ever started, or its pod is gone)."""
        try:
            with self._errors():
                pod = self._launcher_pod(name)
                return None if pod is None else logview.first_failure(self._pod_log(pod, follow=False))
        except ClusterError:
            return None

    def _launcher_pods(self, name: str) -> list:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=LAUNCHER_SELECTOR.format(name=name),
                                             _request_timeout=TIMEOUT).items
        return sorted(pods, key=lambda p: (_time(p.metadata.creation_timestamp) or _EPOCH, p.metadata.name))

    def _launcher_pod(self, name: str):
        """The newest launcher pod whose container has started (its log exists), else None."""
        started = [p for p in self._launcher_pods(name) if _started(p)]
        return started[-1] if started else None

    def _next_launcher(self, name: str, followed: set[tuple[str, int]]):
        """The launcher run to follow next, waiting for one to start; None once the job has finished
        with nothing new to show."""
        while True:
            pod = self._launcher_pod(name)
            if pod is not None and _run_key(pod) not in followed:
                return pod
            status = job_status(self._get(name))
            if status.finished:
                if pod is None and not followed:
                    raise ClusterError(f"mpijob {name} {status.phase.lower()} and its launcher pod is gone "
                                       "(cleanPodPolicy or ttlSecondsAfterFinished removed it); "
                                       f"`hvdk8s status {name}` shows how it ended")
                return None
            time.sleep(POLL_S)

    def _pod_log(self, pod, follow: bool) -> Iterator[str]:
        """The pod's log line by line, as the API server serves it (streamed from the node's kubelet)."""
        # A followed log may stay quiet for as long as training does: no read timeout then (the server
        # was reached a moment ago, so no connect timeout is needed either).
        timeout = {} if follow else {"_request_timeout": TIMEOUT}
        response = self.core.read_namespaced_pod_log(
            pod.metadata.name, self.namespace, container=pod.spec.containers[0].name, follow=follow,
            _preload_content=False, **timeout)
        pending = b""
        try:
            for chunk in response.stream(64 * 1024):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            response.release_conn()

    def delete(self, name: str) -> list[str]:
        """Delete the MPIJob (its pods go with it), the job's ConfigMap and its PodMonitor if it has one;
        returns what was removed."""
        from kubernetes.client.exceptions import ApiException

        configmap = f"{name}-job"
        with self._errors():
            job = self._get(name)
            try:
                cm = self.core.read_namespaced_config_map(configmap, self.namespace, _request_timeout=TIMEOUT)
                ours = _belongs_to(self.conn.api.sanitize_for_serialization(cm.metadata), job)
            except ApiException as e:
                if e.status != 404:
                    raise
                ours = False
            monitor = self._own_pod_monitor(name, job)
            # Background: the garbage collector removes the pods; a cluster without one keeps nothing stuck.
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                        propagation_policy="Background", _request_timeout=TIMEOUT)
            removed = [f"mpijob/{name}"]
            if ours:
                try:
                    self.core.delete_namespaced_config_map(configmap, self.namespace, _request_timeout=TIMEOUT)
                except ApiException as e:
                    if e.status != 404:  # the garbage collector was quicker
                        raise
                removed.append(f"configmap/{configmap}")
            if monitor:
                try:
                    self._delete_owned(POD_MONITOR_KIND, name, self.namespace)
                except ApiException as e:
                    if e.status != 404:
                        raise
                removed.append(f"podmonitor/{name}")
        return removed

    def _own_pod_monitor(self, name: str, job: dict) -> bool:
        """Whether the job has a PodMonitor of its own (none where PodMonitors are not served, or may not be
        read: the garbage collector removes an owned one then)."""
        from kubernetes.client.exceptions import ApiException

        try:
            pm = self.custom.get_namespaced_custom_object(PM_GROUP, PM_VERSION, self.namespace, POD_MONITOR_PLURAL,
                                                          name, _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status in (403, 404):
                return False
            raise
        return _belongs_to(pm.get("metadata") or {}, job)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _owned_by(configmap: dict, job: dict) -> dict:
    meta = job["metadata"]
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"], "uid": meta["uid"],
             "controller": True}
    return {**configmap, "metadata": {**configmap["metadata"], "ownerReferences": [owner]}}


def _belongs_to(meta: dict, job: dict) -> bool:
    """The object (its metadata as a dict) is this job's: owned by it, or (applied from `hvdk8s render`)
    labelled for it."""
    uid, owners = job["metadata"]["uid"], meta.get("ownerReferences") or []
    if any(ref.get("uid") == uid for ref in owners):
        return True
    labels = meta.get("labels") or {}
    return not owners and labels.get("app.kubernetes.io/managed-by") == "hvdk8s" \
        and labels.get("hvdk8s.io/job") == job["metadata"]["name"]


def _already_exists(status: JobStatus, namespace: str) -> ClusterError:
    age = status.age()
    since = f", {int(age.total_seconds())}s old" if age is not None else ""
    return ClusterError(f"mpijob {status.name} already exists in namespace {namespace} ({status.phase}{since}); "
                        f"a launch never replaces a job: `hvdk8s delete {status.name} -n {namespace}` first, or "
                        "rename this one (--set name=...)", status=409)


def _is_client_error(e: BaseException) -> bool:
    """A failure of a request (the server answered no, or could not be reached), not of our code."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    return isinstance(e, (ClusterError, ApiException, urllib3.exceptions.HTTPError, OSError))


def _details_kind(e) -> Optional[str]:
    return (status_body(e).get("details") or {}).get("kind")


def _started(pod) -> bool:
    """Whether the launcher container has started, so that its log can be read."""
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.name == pod.spec.containers[0].name and cs.state and (cs.state.running or cs.state.terminated):
            return True
    return False


def _run_key(pod) -> tuple[str, int]:
    """One run of the launcher container: the pod, and how often its container restarted."""
    restarts = next((cs.restart_count or 0 for cs in (pod.status.container_statuses or [])
                     if cs.name == pod.spec.containers[0].name), 0)
    return pod.metadata.uid, restarts
