"""The verbs on a job already on a cluster: `status`, `logs`, `wait`, `list`, `delete`. Thin: each calls
`hvdk8s.launch.kubernetes.KubernetesLauncher` and prints.

Exit codes, for scripts: 0 the job succeeded (or the verb did what it says), 1 the job failed, 2 anything
the user can fix (a bad job file, an unreachable cluster, no MPIJob API, forbidden, a name taken, a
missing namespace, a wait that timed out), each said in one line of cause and remedy.
"""
from __future__ import annotations

from typing import Optional

import click
from rich.console import Console
from rich.markup import escape

from hvdk8s import logformat
from hvdk8s.cli.cluster_output import connect, emit, first_failure, replicas, say_failure, say_phase
from hvdk8s.cli.group import verb
from hvdk8s.cli.options import duration, log_format_option, output_option, target_options
from hvdk8s.cli.report import err
from hvdk8s.core.errors import UserError
from hvdk8s.mpijob.api import WORKER


@verb()
@click.argument("name")
@target_options()
@output_option
def status(name: str, context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str],
           output: Optional[str]) -> None:
    """Show a cluster job's phase, conditions, replicas and age."""
    from hvdk8s.launch.base import human_age

    st = connect(context, namespace, kubeconfig).status(name)
    if output:
        emit(st.to_dict(), output)
        return
    created = st.to_dict()["created"]
    lines = [f"mpijob {st.name} (namespace {st.namespace})",
             f"  phase:      {st.phase}" + (f": {st.message}" if st.message and st.finished else ""),
             f"  age:        {human_age(st.age())}" + (f" (created {created})" if created else ""),
             f"  replicas:   {replicas(st)}"]
    if st.conditions:
        lines.append("  conditions:")
        width = max(len(c.type) for c in st.conditions)
        for c in st.conditions:
            since = human_age(_since(c.since))
            lines.append(f"    {c.type:<{width}}  {c.status:<5}  {since:>4} ago  {c.reason}"
                         + (f": {c.message}" if c.message else ""))
    else:
        lines.append("  conditions: none yet (the operator has not picked the job up)")
    click.echo("\n".join(lines))


def _since(moment):
    import datetime as dt

    return None if moment is None else dt.datetime.now(dt.timezone.utc) - moment


@verb()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Wait for the launcher, follow its log until the job ends.")
@click.option("--raw", is_flag=True, help="Print the log as it is (no progress view).")
@log_format_option
@target_options()
def logs(name: str, follow: bool, raw: bool, log_format: str, context: Optional[str], namespace: Optional[str],
         kubeconfig: Optional[str]) -> Optional[int]:
    """Print a cluster job's log, drawn like a local launch.

    The launcher's log, which carries every rank's output: rank 0's progress, epochs and result. With -f,
    exit as the job ended (0 succeeded, 1 failed)."""
    from hvdk8s.launch import logview
    from hvdk8s.launch.base import FAILED

    if raw and log_format == "json":
        raise UserError("--raw, --log-format json: one at a time (the log as it is, or as JSON lines)")
    log = logformat.JsonLog(name) if log_format == "json" else None
    launcher = connect(context, namespace, kubeconfig)
    lines = launcher.logs(name, follow=follow)
    failed = None
    if raw:
        for line in lines:
            click.echo(line)
    elif log:
        failed = logview.draw(lines, log)
    else:
        failed = logview.show(lines, Console(soft_wrap=True))
    final = launcher.status(name) if follow or failed else None
    if failed and final.phase != FAILED:  # a rank's traceback alone does not fail a job (it may live on)
        failed = None
    code = 0 if final is None or final.succeeded else 1
    if log and follow:  # the job's end, as the last record
        log.exit(code, final.phase, failed.summary() if failed else final.message)
    elif follow:
        say_phase(final)
    if failed and not log:
        say_failure(failed)
    return code if follow else None


@verb()
@click.argument("name")
@click.option("--timeout", callback=duration, metavar="DURATION",
              help="Give up after this long (90s, 10m, 1h30m); the job goes on. Default: no limit.")
@target_options()
@output_option
def wait(name: str, timeout: Optional[float], context: Optional[str], namespace: Optional[str],
         kubeconfig: Optional[str], output: Optional[str]) -> int:
    """Wait for a cluster job to end; exit 0 if it succeeded.

    Prints each change of phase; exits 1 if the job failed, naming the rank that failed first when the
    launcher's log says it."""
    launcher = connect(context, namespace, kubeconfig)
    final = launcher.wait(name, timeout, on_change=None if output else say_phase)
    if output:
        emit(final.to_dict(), output)
    failed = first_failure(launcher, final)
    if failed:  # the last line, as `hvdk8s logs` ends
        say_failure(failed)
    return 0 if final.succeeded else 1


@verb("list")
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs in every namespace.")
@target_options()
@output_option
def list_jobs(all_namespaces: bool, context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str],
              output: Optional[str]) -> None:
    """List the MPIJobs in a namespace: name, phase, workers, age."""
    from hvdk8s.launch.base import human_age

    launcher = connect(context, namespace, kubeconfig)
    jobs = launcher.list(all_namespaces)
    if output:
        emit([st.to_dict() for st, _ in jobs], output)
        return
    if not jobs:
        where = "any namespace" if all_namespaces else f"namespace {launcher.namespace}"
        err.print(f"no MPIJobs in {escape(where)}")
        return
    rows = [(["NAMESPACE"] if all_namespaces else []) + ["NAME", "PHASE", "WORKERS", "AGE"]]
    for st, obj in jobs:
        # No Worker replica spec: the launcher runs the ranks itself (runLauncherAsWorker).
        workers = (((obj.get("spec") or {}).get("mpiReplicaSpecs") or {}).get(WORKER) or {}).get("replicas", 0)
        rows.append(([st.namespace or ""] if all_namespaces else []) + [st.name, st.phase, str(workers),
                                                                        human_age(st.age())])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


@verb()
@click.argument("name")
@target_options()
def delete(name: str, context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str]) -> None:
    """Delete a cluster job, its pods and its ConfigMap.

    The MPIJob (its pods go with it) and its ConfigMap."""
    for ref in connect(context, namespace, kubeconfig).delete(name):
        click.echo(f"deleted {ref}")
