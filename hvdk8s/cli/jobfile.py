"""The verbs on a job file alone, nothing started: `validate` (a job file, or a YAML of MPIJobs) and
`render` (the MPIJob and ConfigMap a cluster would get)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click
from rich.markup import escape

from hvdk8s.cli import report
from hvdk8s.cli.group import verb
from hvdk8s.cli.jobs import check_code, load
from hvdk8s.cli.options import chosen_output_dir, output_dir_option, set_option
from hvdk8s.core import safeyaml
from hvdk8s.core.errors import UserError
from hvdk8s.spec import JobSpec, read_job_file


@verb()
@click.argument("job", type=click.Path(dir_okay=False))
@set_option
@click.option("--print", "show", is_flag=True, help="Print the job with every default filled in.")
@click.option("--crd", type=click.Path(dir_okay=False, exists=True),
              help="MPIJobs: check against this CRD file instead of hvdk8s's own rules.")
@click.option("--crd-from-cluster", is_flag=True, help="MPIJobs: check against the CRD the cluster serves.")
@click.option("--no-import", is_flag=True,
              help="Job files: do not import and call model/dataset factories (e.g. where their code is absent).")
@click.option("--no-policy", is_flag=True,
              help="MPIJobs: judge only as the API server and the MPI operator do, leaving out hvdk8s's own "
                   "policies (no privileged container; no replica type or launcherCreationPolicy the operator "
                   "silently ignores).")
def validate(job: str, overrides: Sequence[str], show: bool, crd: str | None, crd_from_cluster: bool,
             no_import: bool, no_policy: bool) -> None:
    """Check a job file, or a YAML of MPIJobs.

    Exit 2 listing every problem with its field path. Job files with `factory` paths have them imported
    and called, and a carried entrypoint script must exist."""
    from hvdk8s.mpijob.validate import MAX_YAML_BYTES

    raw = read_job_file(job, MAX_YAML_BYTES)  # once (a pipe reads once), within an MPIJob stream's bound
    docs = _mpijob_documents(raw)
    if docs is not None:
        _validate_mpijobs(job, docs, crd, crd_from_cluster, policies=not no_policy)
        return
    spec = load(job, overrides, raw)  # a job file: its own, smaller bound applies
    if not no_import:
        check_code(spec, job)
    _check_for_cluster(spec, job)
    if show:
        from hvdk8s.jobprint import annotated

        click.echo(annotated(spec), nl=False)
    else:
        epochs = f", {spec.training.epochs} epochs" if spec.training.epochs else ""
        click.echo(f"{job}: valid ({spec.summary}{epochs})")


def _check_for_cluster(spec: JobSpec, job: str) -> None:
    """What `render` and `launch` would refuse (the one function they run, `checks.cluster_problems`): an error
    for a job file with cluster settings, a warning for a local one; and what they would note."""
    from hvdk8s.mpijob import checks

    problems = checks.cluster_problems(spec)
    if not checks.has_cluster_settings(spec):
        if problems:
            report.err.print(
                f"[yellow]warning:[/] {escape(job)}: valid for a local launch, but `hvdk8s render` and `launch` "
                f"would refuse it for a cluster (it sets no {' or '.join(f + ':' for f in checks.CLUSTER_FIELDS)}, "
                "so validate judges it as a local job):"
                + "".join(f"\n  [bold]{escape(p)}[/]: {escape(m)}" for p, m in problems))
        return
    if problems:
        raise UserError(f"{job}: cannot run on a cluster as written (`hvdk8s render` and `launch` refuse it)",
                        problems)
    report.note_pod_security(spec)


def _mpijob_documents(raw: bytes) -> list | None:
    """The documents of `raw` if any of them is an MPIJob (else None: treat it as a job file)."""
    from hvdk8s.mpijob.api import KIND
    from hvdk8s.mpijob.validate import MAX_YAML_BYTES

    try:
        docs = safeyaml.loads(raw, max_bytes=MAX_YAML_BYTES)  # many MPIJobs in one stream
    except safeyaml.YAMLInputError:
        return None  # the job-file loader reports it with its line and column
    return docs if any(isinstance(d, dict) and d.get("kind") == KIND for d in docs) else None


def _validate_mpijobs(path: str, docs: list, crd: str | None, crd_from_cluster: bool, policies: bool) -> None:
    from hvdk8s.mpijob import validate as mv

    if crd_from_cluster:
        from hvdk8s.launch.kubernetes import KubernetesLauncher

        schema = KubernetesLauncher.connect().require_schema()  # the current context's cluster
    else:
        try:
            schema = mv.load_crd_schema(crd) if crd else None
        except ValueError as e:
            raise UserError(str(e)) from None
    pods = mv.pod_schema_available()
    problems = mv.validate_documents(docs, schema=schema, pod_schema=pods, policies=policies)
    against = f"CRD {crd}" if crd else "the cluster's CRD" if crd_from_cluster else "hvdk8s's MPIJob rules"
    against += "" if policies else ", hvdk8s's policies left out"
    if problems:
        raise UserError(f"{path}: invalid MPIJob (checked against {against})", [(p.path, p.message) for p in problems])
    click.echo(f"{path}: valid MPIJob (checked against {against}"
               + (", Pod specs against the Kubernetes schema)" if pods else
                  "; Pod specs not checked: pip install 'hvdk8s[validate]')"))


@verb()
@click.argument("job", type=click.Path(dir_okay=False))
@output_dir_option("Write configmap.yaml, mpijob.yaml and kustomization.yaml (and podmonitor.yaml, with a "
                   "PodMonitor) into DIR instead of printing them.")
@set_option
def render(job: str, output_dir: str | None, old_output_dir: str | None, overrides: Sequence[str]) -> None:
    """Render a job as a Kubeflow MPIJob and its ConfigMap.

    The MPIJob and the ConfigMap carrying the job file, as deterministic YAML, for GitOps."""
    from hvdk8s.entrypoint import carried_files
    from hvdk8s.mpijob import render as renderer
    from hvdk8s.mpijob import validate as mv

    output = chosen_output_dir(output_dir, old_output_dir)
    spec = load(job, overrides)
    files = carried_files(spec, Path(job).parent, job)  # a script the ConfigMap carries to the cluster
    # Our own output must pass the operator's rules: a failure here is a bug in hvdk8s, so say so.
    problems = mv.validate_mpijob(renderer.mpijob(spec), pod_schema=mv.pod_schema_available())
    if problems:
        raise report.Failed(1, "hvdk8s rendered an MPIJob the operator would reject; please report it:",
                            [f"  {p}" for p in problems], label="internal error")
    if output:
        for path in renderer.write_directory(spec, output, files):
            click.echo(str(path))
    else:
        click.echo(renderer.to_yaml(renderer.render(spec, files)), nl=False)
    report.note_pod_security(spec)

