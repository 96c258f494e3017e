"""How the cluster verbs reach a job and show it: the launcher of the chosen context and namespace, a job's
phase line, machine-readable output, the rank that failed first."""
from __future__ import annotations

import json
from typing import Any, Optional

import click
from rich.markup import escape

from hvdk8s.cli.report import err


def connect(context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str]):
    from hvdk8s.launch.kubernetes import KubernetesLauncher

    return KubernetesLauncher.connect(context, namespace, kubeconfig)


def emit(data: Any, output: str) -> None:
    """`data` as `-o json` or `-o yaml` prints it."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)


def replicas(status) -> str:
    """`Launcher 1 active; Worker 2 active`: the roles with any count (the operator reports zeros as empty)."""
    parts = [f"{role} " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
             for role, counts in status.replicas.items() if any(counts.values())]
    return "; ".join(parts) or "no replicas running"


def say_phase(status) -> None:
    err.print(f"mpijob/{escape(status.name)}: [bold]{escape(status.phase)}[/] ({escape(replicas(status))})"
              + (f": {escape(status.message)}" if status.finished and status.message else ""))  # free text


def first_failure(launcher, final):
    """For a failed job, the rank that failed first as its launcher's log names it (None when it names none,
    or the log is gone): what `hvdk8s logs` ends with, so that a wait says the cause without a second command."""
    from hvdk8s.launch.base import FAILED

    return launcher.first_failure(final.name) if final.phase == FAILED else None


def say_failure(failed) -> None:
    """The rank that failed first, as the last line: what a user looks for first, above mpirun's and the
    other ranks' words."""
    err.print(failed.summary(), markup=False)
