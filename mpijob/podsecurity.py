"""The Kubernetes Pod Security Standards (baseline and restricted), checked on a pod, and the level each job
shape needs.

`violations(pod)` applies the controls as the Pod Security admission controller does at its newest
version (k8s.io/pod-security-admission, policy/check_*.go, read for this module): a Pod or PodTemplateSpec
as a dict in, every control it breaks out, with the level the control belongs to and the field path.
`level(pod)` is the strictest level the pod meets: the label value (`pod-security.kubernetes.io/enforce`)
of the namespaces that admit it. Users can run it on any rendered pod:

    python -m hvdk8s.mpijob.podsecurity mpijob.yaml

`requirements(spec)` says which job-file settings need more than the restricted level, and why; a test
renders every job shape and checks the two agree.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from .api import KIND

LEVELS = ("privileged", "baseline", "restricted")  # from least to most strict

BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem", "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUME_TYPES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                     "persistentVolumeClaim", "projected", "secret"})
PROFILE_TYPES = frozenset({"RuntimeDefault", "Localhost"})  # seccomp and AppArmor alike
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


@dataclass(frozen=True, order=True)
class Violation:
    level: str    # the level whose control this breaks: "baseline" or "restricted"
    path: str     # where, in the pod
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} ({self.level})"


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _containers(spec: dict, path: str) -> Iterator[tuple[dict, str]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        items = spec.get(field)
        for i, container in enumerate(items if isinstance(items, list) else []):
            if isinstance(container, dict):
                yield container, f"{path}.{field}[{i}]"


def violations(pod: dict, path: str = "") -> list[Violation]:
    """Every Pod Security Standards control POD (a Pod or PodTemplateSpec dict) breaks, sorted."""
    meta, spec = _d(pod.get("metadata")), _d(pod.get("spec"))
    where = f"{path}.spec" if path else "spec"
    baseline = _baseline(meta, spec, where, f"{path}.metadata" if path else "metadata")
    # A field that breaks a baseline control is reported once, at that level (as the admission controller's
    # restricted checks override their baseline twins rather than add to them).
    at_baseline = {v.path for v in baseline}
    return sorted(baseline + [v for v in _restricted(spec, where) if v.path not in at_baseline])


def level(pod: dict) -> str:
    """The strictest Pod Security level POD meets."""
    broken = {v.level for v in violations(pod)}
    return "privileged" if "baseline" in broken else "baseline" if "restricted" in broken else "restricted"


def breaks(pod: dict, enforced: str) -> list[Violation]:
    """What a namespace enforcing ENFORCED would reject POD for (nothing for privileged)."""
    allowed = LEVELS.index(enforced)
    return [v for v in violations(pod) if LEVELS.index(v.level) <= allowed]


def _baseline(meta: dict, spec: dict, path: str, meta_path: str) -> list[Violation]:
    out: list[Violation] = []

    def bad(where: str, message: str) -> None:
        out.append(Violation("baseline", where, message))

    pod_sc = _d(spec.get("securityContext"))
    user_namespace = spec.get("hostUsers") is False  # the newest checks relax procMount in a user namespace
    if _d(pod_sc.get("windowsOptions")).get("hostProcess") is True:
        bad(f"{path}.securityContext.windowsOptions.hostProcess", "Windows HostProcess pods are not allowed")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field) is True:
            bad(f"{path}.{field}", "sharing the host's namespaces is not allowed")
    for i, volume in enumerate(spec.get("volumes") or []):
        if isinstance(volume, dict) and "hostPath" in volume:
            bad(f"{path}.volumes[{i}].hostPath", f"hostPath volume {volume.get('name')!r} is not allowed")
    _profile(pod_sc, f"{path}.securityContext", bad)
    for j, sysctl in enumerate(pod_sc.get("sysctls") or []):
        name = _d(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            bad(f"{path}.securityContext.sysctls[{j}].name", f"sysctl {name!r} is not in the safe set")
    for key, value in _d(meta.get("annotations")).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (value in ("", "runtime/default")
                                                             or str(value).startswith("localhost/")):
            bad(f"{meta_path}.annotations[{key}]", f"AppArmor profile {value!r} is not allowed")
    for container, where in _containers(spec, path):
        sc = _d(container.get("securityContext"))
        at = f"{where}.securityContext"
        if sc.get("privileged") is True:
            bad(f"{at}.privileged", "privileged containers are not allowed")
        added = sorted(set(_d(sc.get("capabilities")).get("add") or []) - BASELINE_CAPABILITIES)
        if added:
            bad(f"{at}.capabilities.add", f"capabilities {', '.join(map(str, added))} are beyond the default set")
        if _d(sc.get("windowsOptions")).get("hostProcess") is True:
            bad(f"{at}.windowsOptions.hostProcess", "Windows HostProcess containers are not allowed")
        if sc.get("procMount") not in (None, "Default") and not user_namespace:
            bad(f"{at}.procMount", f"procMount {sc['procMount']!r} is not allowed")
        _profile(sc, at, bad)
        for k, port in enumerate(container.get("ports") or []):
            if _d(port).get("hostPort") not in (None, 0):
                bad(f"{where}.ports[{k}].hostPort", "host ports are not allowed")
        for field in ("livenessProbe", "readinessProbe", "startupProbe"):
            for handler in ("httpGet", "tcpSocket"):
                if _d(_d(container.get(field)).get(handler)).get("host"):
                    bad(f"{where}.{field}.{handler}.host", "probes may not name a host")
        for hook in ("postStart", "preStop"):
            for handler in ("httpGet", "tcpSocket"):
                if _d(_d(_d(container.get("lifecycle")).get(hook)).get(handler)).get("host"):
                    bad(f"{where}.lifecycle.{hook}.{handler}.host", "lifecycle handlers may not name a host")
    return out


def _profile(sc: dict, at: str, bad) -> None:
    """seccomp, AppArmor and SELinux settings of one security context (pod or container), as baseline allows."""
    seccomp = sc.get("seccompProfile")
    if isinstance(seccomp, dict) and seccomp.get("type") not in PROFILE_TYPES:
        bad(f"{at}.seccompProfile.type", f"seccomp profile {seccomp.get('type')!r} is not allowed")
    apparmor = sc.get("appArmorProfile")
    if isinstance(apparmor, dict) and apparmor.get("type") not in PROFILE_TYPES:
        bad(f"{at}.appArmorProfile.type", f"AppArmor profile {apparmor.get('type')!r} is not allowed")
    selinux = sc.get("seLinuxOptions")
    if isinstance(selinux, dict):
        if selinux.get("type", "") not in SELINUX_TYPES:
            bad(f"{at}.seLinuxOptions.type", f"SELinux type {selinux.get('type')!r} is not allowed")
        for field in ("user", "role"):
            if selinux.get(field):
                bad(f"{at}.seLinuxOptions.{field}", f"a custom SELinux {field} is not allowed")


def _restricted(spec: dict, path: str) -> list[Violation]:
    out: list[Violation] = []

    def bad(where: str, message: str) -> None:
        out.append(Violation("restricted", where, message))

    pod_sc = _d(spec.get("securityContext"))
    windows = _d(spec.get("os")).get("name") == "windows"
    user_namespace = spec.get("hostUsers") is False
    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = sorted(k for k in _d(volume) if k != "name")
        if kinds and kinds[0] not in RESTRICTED_VOLUME_TYPES and kinds[0] != "hostPath":  # hostPath: baseline's
            bad(f"{path}.volumes[{i}].{kinds[0]}", f"{kinds[0]} volumes are not among the restricted volume types")
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_non_root is False and not user_namespace:
        bad(f"{path}.securityContext.runAsNonRoot", "must be true")
    if pod_sc.get("runAsUser") == 0 and not user_namespace:
        bad(f"{path}.securityContext.runAsUser", "must not be 0 (root)")
    # Containers that leave a setting to the pod are blamed only when the pod does not set it wrongly itself.
    pod_seccomp = _d(pod_sc.get("seccompProfile")).get("type") in PROFILE_TYPES or "seccompProfile" in pod_sc
    pod_non_root = True if pod_non_root is False else pod_non_root
    for container, where in _containers(spec, path):
        sc = _d(container.get("securityContext"))
        at = f"{where}.securityContext"
        if not windows and sc.get("allowPrivilegeEscalation") is not False:
            bad(f"{at}.allowPrivilegeEscalation", "must be false")
        if not user_namespace:
            if sc.get("runAsNonRoot") is False or (sc.get("runAsNonRoot") is None and pod_non_root is not True):
                bad(f"{at}.runAsNonRoot", "must be true (here or for the pod)")
            if sc.get("runAsUser") == 0:
                bad(f"{at}.runAsUser", "must not be 0 (root)")
        if sc.get("procMount") not in (None, "Default"):
            bad(f"{at}.procMount", f"procMount {sc['procMount']!r} is not allowed")
        if not windows:
            if "seccompProfile" not in sc and not pod_seccomp:
                bad(f"{at}.seccompProfile.type", "must be RuntimeDefault or Localhost (here or for the pod)")
            caps = _d(sc.get("capabilities"))
            if "ALL" not in (caps.get("drop") or []):
                bad(f"{at}.capabilities.drop", "must include ALL")
            extra = sorted(set(caps.get("add") or []) - {"NET_BIND_SERVICE"})
            if extra:
                bad(f"{at}.capabilities.add", f"only NET_BIND_SERVICE may be added, not {', '.join(map(str, extra))}")
    return out


# --- what job files need ----------------------------------------------------------------------------

def requirements(spec) -> list[tuple[str, str, str]]:
    """(level, job-file field, why) for each setting of a job (a JobSpec) that needs more than restricted."""
    out = []
    if spec.cached_dataset is not None:
        field = "dataset.path" if spec.dataset.remote else "dataset.cache"
        out.append(("privileged", field, "the node-local dataset cache is a hostPath volume, handed to the MPI "
                                         "user by a root init container with CAP_CHOWN"))
    for i, volume in enumerate(spec.kubernetes.volumes):
        if volume.host_path is not None:
            out.append(("privileged", f"kubernetes.volumes[{i}].host_path", "hostPath volumes are beyond baseline"))
        elif volume.nfs is not None:
            out.append(("baseline", f"kubernetes.volumes[{i}].nfs", "nfs volumes are not among the restricted "
                        "level's volume types (a PersistentVolumeClaim bound to an NFS PersistentVolume is)"))
    return out


def job_level(spec) -> str:
    """The strictest Pod Security level every pod of the job meets."""
    return min((need for need, _, _ in requirements(spec)), key=LEVELS.index, default="restricted")


ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def rejected_by(spec, enforced: str) -> list[tuple[str, str, str]]:
    """(level, job-file field, why) of each setting for which a namespace enforcing ENFORCED rejects the pods."""
    return [r for r in requirements(spec) if LEVELS.index(r[0]) < LEVELS.index(enforced)]


def level_note(spec) -> str | None:
    """For a job whose pods need more than restricted: which level, why, and which namespaces reject them."""
    needs = requirements(spec)
    if not needs:
        return None
    level = job_level(spec)
    stricter = " or ".join(LEVELS[LEVELS.index(level) + 1:])
    why = "; ".join(f"{field}: {reason}" for _, field, reason in needs)
    return (f"job {spec.name!r} needs the {level} Pod Security level ({why}); a namespace labelled "
            f"{ENFORCE_LABEL}={stricter} rejects its pods")


# --- command line -----------------------------------------------------------------------------------

def _pods(doc: Any) -> Iterable[tuple[str, dict]]:
    """(name, pod or pod template) in a loaded YAML document: a Pod, an MPIJob's replicas, a workload's template."""
    if not isinstance(doc, dict):
        return
    kind, spec = doc.get("kind"), _d(doc.get("spec"))
    name = f"{kind}/{_d(doc.get('metadata')).get('name')}"
    if kind == "Pod":
        yield name, doc
    elif kind == KIND:
        for role, replica in _d(spec.get("mpiReplicaSpecs")).items():
            yield f"{name} {role}", _d(_d(replica).get("template"))
    elif isinstance(spec.get("template"), dict):
        yield name, spec["template"]


def main(argv: list[str] | None = None) -> int:
    import yaml

    files = sys.argv[1:] if argv is None else argv
    if not files:
        print("usage: python -m hvdk8s.mpijob.podsecurity FILE.yaml...  (the Pod Security level of each pod)")
        return 2
    for file in files:
        with open(file, encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                for name, pod in _pods(doc):
                    print(f"{file}: {name}: {level(pod)}")
                    for v in violations(pod):
                        print(f"  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
