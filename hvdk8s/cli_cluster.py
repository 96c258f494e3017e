"""The cluster verbs of the `hvdk8s` command: `launch JOB.yaml` (its cluster half), `status`, `logs`,
`wait`, `list`, `delete`. Thin: each calls `hvdk8s.launch.kubernetes.KubernetesLauncher` and prints.

Exit codes, for scripts: 0 the job succeeded (or the verb did what it says), 1 the job failed, 2 anything
the user can fix (a bad job file, an unreachable cluster, no MPIJob API, forbidden, a name taken, a
missing namespace, a wait that timed out), each said in one line of cause and remedy.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click
from rich.console import Console

from hvdk8s import logformat
from hvdk8s.errors import UserError
from hvdk8s.mpijob.api import WORKER

err = Console(stderr=True, soft_wrap=True, highlight=False)
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def _duration(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[float]:
    """`90`, `90s`, `10m`, `1h30m` as seconds."""
    if value is None:
        return None
    m = _DURATION.match(value.strip())
    if not value.strip() or not m:
        raise click.BadParameter(f"{value!r} is not a duration: write 90, 90s, 10m or 1h30m")
    hours, minutes, seconds = m.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def target_options(namespace_default: str = "the context's, else \"default\""):
    """Where the job lives, as kubectl users say it; -n's help says where its default comes from."""
    def decorate(f):
        f = click.option("--kubeconfig", type=click.Path(dir_okay=False), envvar=None,
                         help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).")(f)
        f = click.option("-n", "--namespace", help=f"Namespace (default: {namespace_default}).")(f)
        return click.option("--context", help="Kubeconfig context (default: the current one).")(f)
    return decorate


class Choice(click.Choice):
    """A choice that answers a typo with the choice meant, as click does for verbs and options."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            from hvdk8s import suggest

            meant = suggest.closest(str(value), map(str, self.choices))
            if meant is None:
                raise
            self.fail(f"{value!r} is not one of {', '.join(map(repr, self.choices))}; did you mean {meant!r}?",
                      param, ctx)


def output_option(f):
    return click.option("-o", "--output", type=Choice(["json", "yaml"]),
                        help="Print machine-readable output instead of text.")(f)


def log_format_option(f):
    return click.option("--log-format", type=Choice(logformat.FORMATS), default=logformat.DEFAULT_FORMAT,
                        show_default=True,
                        help="json: stdout carries one JSON object per line (each event, each other line of "
                             "output, the job's end), for log stacks.")(f)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _launcher(context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str]):
    from hvdk8s.launch.kubernetes import KubernetesLauncher

    return KubernetesLauncher.connect(context, namespace, kubeconfig)


def _emit(data: Any, output: str) -> None:
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)


def _replicas(status) -> str:
    """`Launcher 1 active; Worker 2 active`: the roles with any count (the operator reports zeros as empty)."""
    parts = [f"{role} " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
             for role, counts in status.replicas.items() if any(counts.values())]
    return "; ".join(parts) or "no replicas running"


def _say_phase(status) -> None:
    err.print(f"mpijob/{_escape(status.name)}: [bold]{_escape(status.phase)}[/] ({_escape(_replicas(status))})"
              + (f": {_escape(status.message)}" if status.finished and status.message else ""))  # free text


def note_pod_security(spec) -> None:
    """On stderr: the Pod Security level a job's pods need, when it is more than restricted (render, launch)."""
    from hvdk8s.mpijob.podsecurity import level_note

    note = level_note(spec)
    if note:
        err.print("[yellow]note:[/] " + _escape(note))


# --- launch (the cluster half; `hvdk8s launch --local` stays in cli.py) ------------------------------

def resolve_namespace(spec, flag: Optional[str], context: Optional[str], kubeconfig: Optional[str],
                      source: str) -> Optional[str]:
    """The namespace a launch goes to, when it is not the job file's: --namespace, else (when the job file
    names none) the context's. A job file and a --namespace that disagree are refused, as kubectl does."""
    from hvdk8s.launch.kubeclient import context_namespace

    from_file = "namespace" in spec.kubernetes.model_fields_set
    if flag and from_file and flag != spec.kubernetes.namespace:
        raise UserError(f"{source}: the job file says namespace {spec.kubernetes.namespace}, --namespace says {flag}; "
                        "drop one of them")
    if flag:
        return flag
    return None if from_file else context_namespace(context, kubeconfig)


def launch_on_cluster(spec, job: str, context: Optional[str], kubeconfig: Optional[str], dry_run: bool,
                      wait: bool, timeout: Optional[float], output: Optional[str],
                      log_format: str = logformat.DEFAULT_FORMAT) -> int:
    """Submit the job (or print what would be sent); with `wait`, follow it to its end. Returns the exit code."""
    from hvdk8s.launch import kubernetes as kube

    if timeout is not None and not wait:
        raise UserError("--timeout: only with --wait (it bounds the wait, not the job: see "
                        "kubernetes.active_deadline_seconds)")
    log = _json_log(spec.name, log_format, wait, output, dry_run)
    job_dir = Path(job).parent
    if dry_run:
        objects = kube.manifests(spec, job_dir, job)
        note_pod_security(spec)
        if output == "json":
            _emit(objects, "json")
        else:
            from hvdk8s.mpijob.render import to_yaml

            click.echo("# hvdk8s launch --dry-run: sent in this order; the ConfigMap (and a PodMonitor) is then owned "
                       "by the MPIJob (an ownerReference with the uid the server gives it)\n" + to_yaml(objects), nl=False)
        return 0
    launcher = kube.KubernetesLauncher.connect(context, spec.kubernetes.namespace, kubeconfig)
    name = launcher.submit(spec, job_dir, job, on_note=lambda note: err.print("[yellow]note:[/] " + _escape(note)))
    note_pod_security(spec)
    ns, made = launcher.namespace, [f"{o['kind'].lower()}/{o['metadata']['name']}" for o in launcher.created]
    where = f"namespace {ns}" + (f", context {launcher.conn.context}" if launcher.conn.context else "")
    if log:
        log.write(logformat.record(name, "submitted", fields={"namespace": ns, "context": launcher.conn.context,
                                                              "created": made}))
    elif output is None:
        click.echo(f"created {' and '.join(made)} in {where}")
    if not wait:
        if output:
            _emit({"name": name, "namespace": ns, "context": launcher.conn.context, "created": made}, output)
        else:
            click.echo(f"  follow it: hvdk8s logs -f {name} -n {ns}\n  its state: hvdk8s status {name} -n {ns}"
                       f"\n  wait:      hvdk8s wait {name} -n {ns}\n  remove it: hvdk8s delete {name} -n {ns}")
        return 0
    on_change = _log_phase(log) if log else _say_phase if output is None else None  # -o: one document at the end
    final = launcher.wait(name, timeout, on_change=on_change)
    if output:
        _emit({"name": name, "namespace": ns, "context": launcher.conn.context, "created": made,
               "status": final.to_dict()}, output)
    code = 0 if final.succeeded else 1
    failed = _first_failure(launcher, final)
    if log:
        log.exit(code, final.phase, failed.summary() if failed else final.message)
    elif failed:
        err.print(failed.summary(), markup=False)
    return code


def _first_failure(launcher, final):
    """For a failed job, the rank that failed first as its launcher's log names it (None when it names none,
    or the log is gone): what `hvdk8s logs` ends with, so that a wait says the cause without a second command."""
    from hvdk8s.launch.base import FAILED

    return launcher.first_failure(final.name) if final.phase == FAILED else None


def _json_log(name: str, log_format: str, wait: bool, output: Optional[str], dry_run: bool):
    """The JSON log of a cluster launch (None for text): it follows the job, so only with --wait."""
    if log_format != "json":
        return None
    if output or dry_run:
        raise UserError("--log-format json, --output/--dry-run: one at a time (the log's lines are JSON already)")
    if not wait:
        raise UserError("--log-format json: only with --wait on a cluster (it logs the job to its end); "
                        "`hvdk8s logs -f NAME --log-format json` logs a running one")
    return logformat.JsonLog(name)


def _log_phase(log):
    """Each change of phase as a record."""
    def on_change(status) -> None:
        log.write(logformat.record(status.name, "phase", fields={
            "phase": status.phase, "replicas": {role: dict(counts) for role, counts in status.replicas.items()}}))
    return on_change


# --- status, logs, wait, list, delete ---------------------------------------------------------------

@click.command()
@click.argument("name")
@target_options()
@output_option
def status(name: str, context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str],
           output: Optional[str]) -> None:
    """Show a cluster job's phase, conditions, replicas and age."""
    from hvdk8s.launch.base import human_age

    st = _launcher(context, namespace, kubeconfig).status(name)
    if output:
        _emit(st.to_dict(), output)
        return
    created = st.to_dict()["created"]
    lines = [f"mpijob {st.name} (namespace {st.namespace})",
             f"  phase:      {st.phase}" + (f": {st.message}" if st.message and st.finished else ""),
             f"  age:        {human_age(st.age())}" + (f" (created {created})" if created else ""),
             f"  replicas:   {_replicas(st)}"]
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


@click.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Wait for the launcher, follow its log until the job ends.")
@click.option("--raw", is_flag=True, help="Print the log as it is (no progress view).")
@log_format_option
@target_options()
def logs(name: str, follow: bool, raw: bool, log_format: str, context: Optional[str], namespace: Optional[str],
         kubeconfig: Optional[str]) -> None:
    """Print a cluster job's log, drawn like a local launch.

    The launcher's log, which carries every rank's output: rank 0's progress, epochs and result. With -f,
    exit as the job ended (0 succeeded, 1 failed)."""
    from hvdk8s.launch import logview
    from hvdk8s.launch.base import FAILED

    if raw and log_format == "json":
        raise UserError("--raw, --log-format json: one at a time (the log as it is, or as JSON lines)")
    log = logformat.JsonLog(name) if log_format == "json" else None
    launcher = _launcher(context, namespace, kubeconfig)
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
        _say_phase(final)
    if failed and not log:  # the last line: what a user looks for first, above mpirun's and other ranks' words
        err.print(failed.summary(), markup=False)
    if follow:
        sys.exit(code)


@click.command()
@click.argument("name")
@click.option("--timeout", callback=_duration, metavar="DURATION",
              help="Give up after this long (90s, 10m, 1h30m); the job goes on. Default: no limit.")
@target_options()
@output_option
def wait(name: str, timeout: Optional[float], context: Optional[str], namespace: Optional[str],
         kubeconfig: Optional[str], output: Optional[str]) -> None:
    """Wait for a cluster job to end; exit 0 if it succeeded.

    Prints each change of phase; exits 1 if the job failed, naming the rank that failed first when the
    launcher's log says it."""
    launcher = _launcher(context, namespace, kubeconfig)
    final = launcher.wait(name, timeout, on_change=None if output else _say_phase)
    if output:
        _emit(final.to_dict(), output)
    failed = _first_failure(launcher, final)
    if failed:  # the last line, as `hvdk8s logs` ends
        err.print(failed.summary(), markup=False)
    sys.exit(0 if final.succeeded else 1)


@click.command("list")
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs in every namespace.")
@target_options()
@output_option
def list_jobs(all_namespaces: bool, context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str],
              output: Optional[str]) -> None:
    """List the MPIJobs in a namespace: name, phase, workers, age."""
    from hvdk8s.launch.base import human_age

    launcher = _launcher(context, namespace, kubeconfig)
    jobs = launcher.list(all_namespaces)
    if output:
        _emit([st.to_dict() for st, _ in jobs], output)
        return
    if not jobs:
        where = "any namespace" if all_namespaces else f"namespace {launcher.namespace}"
        err.print(f"no MPIJobs in {where}")
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


@click.command()
@click.argument("name")
@target_options()
def delete(name: str, context: Optional[str], namespace: Optional[str], kubeconfig: Optional[str]) -> None:
    """Delete a cluster job, its pods and its ConfigMap.

    The MPIJob (its pods go with it) and its ConfigMap."""
    for ref in _launcher(context, namespace, kubeconfig).delete(name):
        click.echo(f"deleted {ref}")


COMMANDS: Sequence[click.Command] = (status, logs, wait, list_jobs, delete)
