"""The launcher protocol: the verbs every back end offers for a job, whether its ranks run on this
machine (`local.LocalLauncher`: horovodrun) or on a cluster (`kubernetes.KubernetesLauncher`: an MPIJob).

A job's life is read the way mpi-operator writes it, as conditions (Created, Running, Restarting,
Suspended, Succeeded, Failed) folded into one phase, so that status and wait mean the same everywhere.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence

from hvdk8s.core.errors import UserError

PENDING = "Pending"  # submitted; nothing has acted on it yet (no operator condition)
CREATED, RUNNING, RESTARTING, SUSPENDED = "Created", "Running", "Restarting", "Suspended"
SUCCEEDED, FAILED = "Succeeded", "Failed"
FINISHED = (SUCCEEDED, FAILED)

# Which true condition decides the phase, first match wins: an end beats everything, then a pause,
# then the most advanced state (mpi-operator leaves Created true while Running).
_PRECEDENCE = (SUCCEEDED, FAILED, SUSPENDED, RESTARTING, RUNNING, CREATED)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown", as Kubernetes writes it
    reason: str = ""
    message: str = ""
    since: Optional[dt.datetime] = None  # lastTransitionTime


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands. `replicas` is per role (Launcher, Worker): counts of active, succeeded, failed."""

    name: str
    phase: str
    namespace: Optional[str] = None
    created: Optional[dt.datetime] = None
    conditions: Sequence[Condition] = ()
    replicas: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    exit_code: Optional[int] = None  # local jobs: the ranks' exit status once finished

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    @property
    def succeeded(self) -> bool:
        return self.phase == SUCCEEDED

    @property
    def message(self) -> str:
        """The message of the condition that decided the phase (why a job failed, for one)."""
        for c in self.conditions:
            if c.type == self.phase and c.status == "True":
                return c.message
        return ""

    def age(self, now: Optional[dt.datetime] = None) -> Optional[dt.timedelta]:
        if self.created is None:
            return None
        return (now or dt.datetime.now(dt.timezone.utc)) - self.created

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, with stable keys, for `-o json|yaml`."""
        age = self.age()
        return {
            "name": self.name, "namespace": self.namespace, "phase": self.phase,
            "created": _iso(self.created), "ageSeconds": None if age is None else int(age.total_seconds()),
            "conditions": [{"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
                            "lastTransitionTime": _iso(c.since)} for c in self.conditions],
            "replicaStatuses": {role: dict(counts) for role, counts in self.replicas.items()},
            **({"exitCode": self.exit_code} if self.exit_code is not None else {}),
        }


def phase_of(conditions: Sequence[Condition]) -> str:
    true = {c.type for c in conditions if c.status == "True"}
    return next((kind for kind in _PRECEDENCE if kind in true), PENDING)


class WaitTimeout(UserError):
    """A wait ran out of time while the job went on (the job is left as it is)."""


class Launcher(Protocol):
    """What `hvdk8s launch/status/logs/wait/delete` ask of a back end."""

    def submit(self, spec, job_dir: Path, source: str) -> str:
        """Start the job `spec` (read from the file `source` in `job_dir`); return its name."""

    def status(self, name: str) -> JobStatus: ...

    def logs(self, name: str, follow: bool = False) -> Iterator[str]:
        """The job's output, line by line (on a cluster: the launcher's, which carries every rank's);
        with `follow`, until the job's output ends."""

    def wait(self, name: str, timeout: Optional[float] = None,
             on_change: Optional[Callable[[JobStatus], None]] = None) -> JobStatus:
        """Block until the job finished (WaitTimeout after `timeout` seconds); `on_change` sees each new phase."""

    def delete(self, name: str) -> None:
        """Stop the job and remove everything `submit` made for it."""


def _iso(moment: Optional[dt.datetime]) -> Optional[str]:
    return None if moment is None else moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_age(delta: Optional[dt.timedelta]) -> str:
    """kubectl's style: 45s, 12m, 3h, 2d."""
    if delta is None:
        return "?"
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
