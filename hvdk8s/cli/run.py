"""The verbs that run a job: `launch` (here with --local, else on a cluster) and `train`, what mpirun
starts on each of a job's ranks."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import click

from hvdk8s.cli import cluster_launch, report
from hvdk8s.cli.group import verb
from hvdk8s.cli.jobs import check_code, load
from hvdk8s.cli.options import duration, log_format_option, output_option, set_option, target_options
from hvdk8s.core.errors import UserError


@verb()
@click.argument("job", type=click.Path(dir_okay=False))
@set_option
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue from the newest valid checkpoint in training.checkpoint.dir.")
def train(job: str, overrides: Sequence[str], resume: bool) -> None:
    """Train as one rank of a job (mpirun starts it on each rank).

    What horovodrun or mpirun starts on every rank of a job."""
    from hvdk8s._adapter import die_with_parent

    die_with_parent()  # first: a launcher killed while this rank loads the job takes the rank with it
    from hvdk8s import trainer
    from hvdk8s.data.datasets import dataset_root
    from hvdk8s.failures import report_uncaught
    from hvdk8s.factories import importable_from
    from hvdk8s.core.exiting import exit_at_once
    from hvdk8s.rankmain import line_buffered_stdout

    line_buffered_stdout()  # whole lines through mpirun, events included
    report_uncaught()  # this rank's failure as an event, before Horovod's shutdown tells the others
    spec = load(job, overrides)
    if spec.entrypoint is not None:
        raise UserError(f"{job}: this job runs its own entrypoint; start it with `hvdk8s launch`")
    if spec.dataset.path is not None:
        dataset_root(spec.dataset)  # before Horovod starts: a missing dataset is the user's to fix
    with importable_from(Path(job).parent):  # factories beside a job file run by hand
        trainer.run(spec, resume=resume)
    exit_at_once(0)


@verb()
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--local", "local", is_flag=True, help="Run the ranks on this machine.")
@click.option("-np", "--num-proc", "np", type=click.IntRange(min=1), default=2, show_default=True,
              help="Number of ranks (with --local).")
@click.option("--mpi", "controller", flag_value="mpi", default=True,
              help="Horovod's MPI controller (default: measured faster).")
@click.option("--gloo", "controller", flag_value="gloo", help="Horovod's Gloo controller.")
@click.option("--no-resume", is_flag=True, help="Start from scratch even if checkpoints exist.")
@click.option("--discovery-script", type=click.Path(dir_okay=False, path_type=Path),
              help="Elastic jobs with --local: an executable printing `localhost:SLOTS`, read every second "
                   "(default: -np slots throughout).")
@set_option
@target_options("the job file's kubernetes.namespace, else the context's")
@click.option("--dry-run", is_flag=True, help="Cluster: print the objects it would send, in order; send nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Cluster: follow the job to its end; exit 0 only if it succeeded.")
@click.option("--timeout", callback=duration, metavar="DURATION",
              help="Cluster, with --wait: give up waiting after this long (90s, 10m, 1h30m).")
@output_option
@log_format_option
def launch(job: str, local: bool, np: int, controller: str, no_resume: bool, discovery_script: Optional[Path],
           overrides: Sequence[str], context: str | None, namespace: str | None, kubeconfig: str | None,
           dry_run: bool, wait_: bool, timeout: float | None, output: str | None, log_format: str) -> int:
    """Run a job on a cluster, or here with --local.

    On the cluster of KUBECONFIG/--context as a Kubeflow MPIJob, or with `--local -np N`, as N ranks
    here following rank 0's progress."""
    spec = load(job, overrides)  # fail here, once, rather than in every rank
    if not local:
        from click.core import ParameterSource

        given = click.get_current_context().get_parameter_source
        misplaced = [f for f, p in (("-np", "np"), ("--no-resume", "no_resume"), ("--gloo/--mpi", "controller"),
                                    ("--discovery-script", "discovery_script"))
                     if given(p) == ParameterSource.COMMANDLINE]
        if misplaced:
            raise UserError(f"{', '.join(misplaced)}: only with --local (a cluster job's ranks and resumption "
                            "come from its job file)")
        ns = cluster_launch.resolve_namespace(spec, namespace, context, kubeconfig, job)
        if ns is not None and ns != spec.kubernetes.namespace:
            spec = load(job, [*overrides, f"kubernetes.namespace={ns}"])  # the ConfigMap's copy says it too
        return cluster_launch.launch_on_cluster(spec, job, context, kubeconfig, dry_run, wait_, timeout, output,
                                                log_format)
    cluster_only = [f for f, v in (("--context", context), ("--namespace", namespace), ("--kubeconfig", kubeconfig),
                                   ("--dry-run", dry_run), ("--wait", wait_), ("--timeout", timeout),
                                   ("--output", output)) if v]
    if cluster_only:
        raise UserError(f"{', '.join(cluster_only)}: not with --local (they choose and follow a cluster job)")
    if no_resume and spec.entrypoint is not None:
        raise UserError(f"{job}: --no-resume is for hvdk8s's trainer; this job's entrypoint decides how it resumes")
    check_code(spec, job)
    return _launch_here(spec, job, np, controller, not no_resume, _discovery_script(discovery_script, spec, job),
                        log_format)


def _discovery_script(path: Optional[Path], spec, job: str) -> Optional[Path]:
    """--discovery-script, checked, as the absolute path horovodrun is given."""
    from hvdk8s.launch.local import check_discovery_script

    if path is None:
        return None
    if spec.training.elastic is None:
        raise UserError(f"--discovery-script: {job} is not elastic (set training.elastic)")
    problem = check_discovery_script(path)
    if problem:
        raise UserError(f"--discovery-script: {problem}")
    return path.resolve()


def _launch_here(spec, job: str, np: int, controller: str, resume: bool, discovery_script: Optional[Path],
                 log_format: str) -> int:
    """The ranks on this machine, after the launcher's preflight; their exit status."""
    from hvdk8s.core.termination import exit_status, signal_of
    from hvdk8s.launch import local

    try:
        code, failed = local.run(spec, Path(job).parent, job, np, controller, resume=resume,
                                 discovery_script=discovery_script, log_format=log_format)
    except KeyboardInterrupt as stop:  # the ranks are stopped by now
        raise report.Failed(exit_status(stop), f"stopped by {signal_of(stop).name}, and its ranks with it") from None
    if code:
        raise report.Failed(code, f"the ranks exited with status {code}", [failed.summary()] if failed else [])
    return 0
