"""`hvdk8s launch JOB.yaml`'s cluster half: the namespace it goes to, the objects sent (or printed, with
--dry-run), and with --wait the job followed to its end."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from hvdk8s import logformat
from hvdk8s.cli import report
from hvdk8s.cli.cluster_output import emit, first_failure, say_failure, say_phase
from hvdk8s.core.errors import UserError


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
        report.note_pod_security(spec)
        if output == "json":
            emit(objects, "json")
        else:
            from hvdk8s.mpijob.render import to_yaml

            click.echo("# hvdk8s launch --dry-run: sent in this order; the ConfigMap (and a PodMonitor) is then owned "
                       "by the MPIJob (an ownerReference with the uid the server gives it)\n" + to_yaml(objects), nl=False)
        return 0
    launcher = kube.KubernetesLauncher.connect(context, spec.kubernetes.namespace, kubeconfig)
    name = launcher.submit(spec, job_dir, job, on_note=report.note)
    report.note_pod_security(spec)
    ns, made = launcher.namespace, [f"{o['kind'].lower()}/{o['metadata']['name']}" for o in launcher.created]
    where = f"namespace {ns}" + (f", context {launcher.conn.context}" if launcher.conn.context else "")
    if log:
        log.write(logformat.record(name, "submitted", fields={"namespace": ns, "context": launcher.conn.context,
                                                              "created": made}))
    elif output is None:
        click.echo(f"created {' and '.join(made)} in {where}")
    if not wait:
        if output:
            emit({"name": name, "namespace": ns, "context": launcher.conn.context, "created": made}, output)
        else:
            click.echo(f"  follow it: hvdk8s logs -f {name} -n {ns}\n  its state: hvdk8s status {name} -n {ns}"
                       f"\n  wait:      hvdk8s wait {name} -n {ns}\n  remove it: hvdk8s delete {name} -n {ns}")
        return 0
    on_change = _log_phase(log) if log else say_phase if output is None else None  # -o: one document at the end
    final = launcher.wait(name, timeout, on_change=on_change)
    if output:
        emit({"name": name, "namespace": ns, "context": launcher.conn.context, "created": made,
              "status": final.to_dict()}, output)
    code = 0 if final.succeeded else 1
    failed = first_failure(launcher, final)
    if log:
        log.exit(code, final.phase, failed.summary() if failed else final.message)
    elif failed:
        say_failure(failed)
    return code


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
