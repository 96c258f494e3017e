"""The `hvdk8s` command. Each verb is a thin call into a module; errors in the user's input (every
`hvdk8s.errors.UserError`) reach one handler, `_Verbs.invoke`, which prints the file and field and exits 2,
never a traceback."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import click
from rich.console import Console
from rich.markup import escape  # paths and messages hold user text: brackets must print as typed

from hvdk8s import __version__, cli_cluster
from hvdk8s.bench import run as bench_run
from hvdk8s.errors import UserError
from hvdk8s.spec import JobFileError, JobSpec, dump_job, load_job

err = Console(stderr=True, soft_wrap=True)  # long field paths stay whole for grep and logs

_set_option = click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
                           help="Override a job-file field, e.g. --set training.epochs=3 (repeatable).")


def _output_dir_option(help: str):
    """`-d/--output-dir DIR`. `-o/--output DIR`, its old spelling, still works (hidden, with a note): in
    the other verbs, as in kubectl, -o is the output format."""
    def decorate(f):
        f = click.option("-o", "--output", "old_output_dir", hidden=True, type=click.Path(file_okay=False))(f)
        return click.option("-d", "--output-dir", "output_dir", type=click.Path(file_okay=False), metavar="DIR",
                            help=help)(f)
    return decorate


def _output_dir(output_dir: str | None, old_output_dir: str | None, default: str | None = None) -> str | None:
    """The folder given with -d/--output-dir, or with the old -o/--output (noted on stderr)."""
    if old_output_dir is None:
        return default if output_dir is None else output_dir
    if output_dir is not None:
        raise UserError("-o/--output, -d/--output-dir: one folder at a time (-o DIR is the old spelling of -d DIR)")
    err.print(f"[yellow]note:[/] -o/--output DIR is now -d/--output-dir DIR (-o is the output format in the other "
              "verbs, as in kubectl); -o DIR still works here for now", highlight=False)
    return old_output_dir


def _fail(header: str, problems: Sequence[tuple[str, str]]) -> None:
    """Print every problem with its field path, then exit 2 (the user's input is wrong)."""
    err.print(f"[bold red]error:[/] {escape(header)}", highlight=False)
    for path, msg in problems:
        err.print(f"  [bold]{escape(path or '(top level)')}[/]: {escape(msg)}", highlight=False)
    sys.exit(2)


def _load(job: str, overrides: Sequence[str]) -> JobSpec:
    """The job, valid and within the size the ranks can receive (`hvdk8s.jobsize`)."""
    from hvdk8s import jobsize

    spec = load_job(job, list(overrides))
    too_large = jobsize.problems(spec)
    if too_large:
        raise JobFileError(job, too_large)
    return spec


def _check_code(spec: JobSpec, job: str) -> None:
    from hvdk8s.preflight import check_code

    check_code(spec, Path(job).parent, job)


class _Verb(click.Command):
    """A verb whose "did you mean" offers only the options its --help shows, not an old spelling kept
    hidden (render's -o DIR)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            hidden = {o for p in self.params if getattr(p, "hidden", False) for o in p.opts + p.secondary_opts}
            e.possibilities = [o for o in e.possibilities or () if o not in hidden]
            raise


class _Verbs(click.Group):
    """The verbs, with the one place that reports a `UserError` (for `main` and in-process runners alike)."""

    command_class = _Verb
    group_class = type  # `cache` and its verbs alike

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            _fail(e.header, e.problems)


@click.group(cls=_Verbs, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hvdk8s")
def cli() -> None:
    """Run Horovod training jobs on this machine or a Kubernetes cluster, from one job file."""


@cli.command()
@click.argument("job", type=click.Path(dir_okay=False))
@_set_option
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
    docs = _mpijob_documents(job)
    if docs is not None:
        _validate_mpijobs(job, docs, crd, crd_from_cluster, policies=not no_policy)
        return
    spec = _load(job, overrides)
    if not no_import:
        _check_code(spec, job)
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
            err.print(f"[yellow]warning:[/] {escape(job)}: valid for a local launch, but `hvdk8s render` and "
                      "`launch` would refuse it for a cluster (it sets no "
                      f"{' or '.join(f + ':' for f in checks.CLUSTER_FIELDS)}, so validate judges it as a local job):"
                      + "".join(f"\n  [bold]{escape(p)}[/]: {escape(m)}" for p, m in problems), highlight=False)
        return
    if problems:
        raise UserError(f"{job}: cannot run on a cluster as written (`hvdk8s render` and `launch` refuse it)",
                        problems)
    cli_cluster.note_pod_security(spec)


def _mpijob_documents(path: str) -> list | None:
    """The documents of `path` if any of them is an MPIJob (else None: treat it as a job file)."""
    from hvdk8s import safeyaml
    from hvdk8s.mpijob.api import KIND
    from hvdk8s.mpijob.validate import MAX_YAML_BYTES

    try:
        docs = safeyaml.read(path, max_bytes=MAX_YAML_BYTES)  # many MPIJobs in one stream
    except (OSError, safeyaml.YAMLInputError):
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
        _fail(f"{path}: invalid MPIJob (checked against {against})", [(p.path, p.message) for p in problems])
    click.echo(f"{path}: valid MPIJob (checked against {against}"
               + (", Pod specs against the Kubernetes schema)" if pods else
                  "; Pod specs not checked: pip install 'hvdk8s[validate]')"))


@cli.command()
@click.argument("job", type=click.Path(dir_okay=False))
@_set_option
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
    from hvdk8s.rankmain import exit_at_once, line_buffered_stdout

    line_buffered_stdout()  # whole lines through mpirun, events included
    report_uncaught()  # this rank's failure as an event, before Horovod's shutdown tells the others
    spec = _load(job, overrides)
    if spec.entrypoint is not None:
        raise UserError(f"{job}: this job runs its own entrypoint; start it with `hvdk8s launch`")
    if spec.dataset.path is not None:
        dataset_root(spec.dataset)  # before Horovod starts: a missing dataset is the user's to fix
    with importable_from(Path(job).parent):  # factories beside a job file run by hand
        trainer.run(spec, resume=resume)
    exit_at_once(0)


@cli.command()
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
@_set_option
@cli_cluster.target_options("the job file's kubernetes.namespace, else the context's")
@click.option("--dry-run", is_flag=True, help="Cluster: print the objects it would send, in order; send nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Cluster: follow the job to its end; exit 0 only if it succeeded.")
@click.option("--timeout", callback=cli_cluster._duration, metavar="DURATION",
              help="Cluster, with --wait: give up waiting after this long (90s, 10m, 1h30m).")
@cli_cluster.output_option
@cli_cluster.log_format_option
def launch(job: str, local: bool, np: int, controller: str, no_resume: bool, discovery_script: Optional[Path],
           overrides: Sequence[str], context: str | None, namespace: str | None, kubeconfig: str | None,
           dry_run: bool, wait_: bool, timeout: float | None, output: str | None, log_format: str) -> None:
    """Run a job on a cluster, or here with --local.

    On the cluster of KUBECONFIG/--context as a Kubeflow MPIJob, or with `--local -np N`, as N ranks
    here following rank 0's progress."""
    from hvdk8s.launch import local as local_launch

    spec = _load(job, overrides)  # fail here, once, rather than in every rank
    if not local:
        from click.core import ParameterSource

        given = click.get_current_context().get_parameter_source
        misplaced = [f for f, p in (("-np", "np"), ("--no-resume", "no_resume"), ("--gloo/--mpi", "controller"),
                                    ("--discovery-script", "discovery_script"))
                     if given(p) == ParameterSource.COMMANDLINE]
        if misplaced:
            raise UserError(f"{', '.join(misplaced)}: only with --local (a cluster job's ranks and resumption "
                            "come from its job file)")
        ns = cli_cluster.resolve_namespace(spec, namespace, context, kubeconfig, job)
        if ns is not None and ns != spec.kubernetes.namespace:
            spec = _load(job, [*overrides, f"kubernetes.namespace={ns}"])  # the ConfigMap's copy says it too
        sys.exit(cli_cluster.launch_on_cluster(spec, job, context, kubeconfig, dry_run, wait_, timeout, output,
                                               log_format))
    cluster_only = [f for f, v in (("--context", context), ("--namespace", namespace), ("--kubeconfig", kubeconfig),
                                   ("--dry-run", dry_run), ("--wait", wait_), ("--timeout", timeout),
                                   ("--output", output)) if v]
    if cluster_only:
        raise UserError(f"{', '.join(cluster_only)}: not with --local (they choose and follow a cluster job)")
    if no_resume and spec.entrypoint is not None:
        raise UserError(f"{job}: --no-resume is for hvdk8s's trainer; this job's entrypoint decides how it resumes")
    _check_code(spec, job)
    if discovery_script is not None:
        if spec.training.elastic is None:
            raise UserError(f"--discovery-script: {job} is not elastic (set training.elastic)")
        problem = local_launch.check_discovery_script(discovery_script)
        if problem:
            raise UserError(f"--discovery-script: {problem}")
        discovery_script = discovery_script.resolve()
    code, failed = local_launch.run(spec, Path(job).parent, job, np, controller, resume=not no_resume,
                                    discovery_script=discovery_script, log_format=log_format)
    if code:
        err.print(f"[bold red]error:[/] the ranks exited with status {code}")
    if failed:  # the last line: what a user looks for first, above mpirun's and the other ranks' words
        err.print(failed.summary(), markup=False, highlight=False)
    sys.exit(code)


@cli.command()
@click.argument("job", type=click.Path(dir_okay=False))
@_output_dir_option("Write configmap.yaml, mpijob.yaml and kustomization.yaml (and podmonitor.yaml, with a "
                    "PodMonitor) into DIR instead of printing them.")
@_set_option
def render(job: str, output_dir: str | None, old_output_dir: str | None, overrides: Sequence[str]) -> None:
    """Render a job as a Kubeflow MPIJob and its ConfigMap.

    The MPIJob and the ConfigMap carrying the job file, as deterministic YAML, for GitOps."""
    from hvdk8s.mpijob import render as renderer

    from hvdk8s.mpijob import validate as mv

    from hvdk8s.entrypoint import carried_files

    output = _output_dir(output_dir, old_output_dir)
    spec = _load(job, overrides)
    files = carried_files(spec, Path(job).parent, job)  # a script the ConfigMap carries to the cluster
    # Our own output must pass the operator's rules: a failure here is a bug in hvdk8s, so say so.
    problems = mv.validate_mpijob(renderer.mpijob(spec), pod_schema=mv.pod_schema_available())
    if problems:
        err.print("[bold red]internal error:[/] hvdk8s rendered an MPIJob the operator would reject; "
                  "please report it:\n" + "\n".join(f"  {escape(str(p))}" for p in problems), highlight=False)
        sys.exit(1)
    if output:
        for path in renderer.write_directory(spec, output, files):
            click.echo(str(path))
    else:
        click.echo(renderer.to_yaml(renderer.render(spec, files)), nl=False)
    cli_cluster.note_pod_security(spec)


@cli.group()
def cache() -> None:
    """Sync, list and evict datasets in a node-local cache.

    A dataset (directory, s3://, http(s)://) is synced onto a node once, verified.

    S3 credentials and endpoint come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
    AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL)."""


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from hvdk8s.data.cache.sizes import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _renamed_version(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:  # the old spelling, which read as hvdk8s's own --version
        raise UserError(f"--version: a dataset's version is --dataset-version {value or 'VERSION'} "
                        "(`hvdk8s --version` prints hvdk8s's own)")


@cache.command("sync")
@click.argument("src")
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--key", help="Dataset key (directory name); default: derived from SRC and --dataset-version.")
@click.option("--dataset-version", "version", help="Dataset version: a new version gets a new key.")
@click.option("--version", "old_version", hidden=True, is_flag=False, flag_value="", expose_value=False,
              callback=_renamed_version)
@click.option("--verify", is_flag=True, help="Re-hash every cached file and re-fetch any that differ.")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True, help="Parallel copies.")
@click.option("--quota", callback=_size, metavar="SIZE",
              help="Keep the cache within SIZE (e.g. 50Gi), evicting least recently used datasets not in use.")
@click.option("--lease", callback=cli_cluster._duration, metavar="DURATION",
              help="Once synced, keep the dataset from eviction this long (90s, 10m, 1h30m), as if held: for "
                   "jobs whose ranks start after this command exits (a cluster's init container).")
def cache_sync(src: str, dst: str, key: str | None, version: str | None, verify: bool, workers: int,
               quota: int | None, lease: float | None) -> None:
    """Sync SRC into the cache at DST.

    Prints the synced data directory last."""
    from hvdk8s.data import cache as dc

    result = dc.sync(src, dst, key=key, version=version, verify=verify, workers=workers, progress=True,
                     quota_bytes=quota, lease_seconds=lease)
    click.echo(str(result.path))


@cache.command("ls")
@click.argument("dst", type=click.Path(file_okay=False), required=False)
def cache_ls(dst: str | None) -> None:
    """List the datasets in the cache at DST.

    DST defaults to this node's cache, where `hvdk8s launch --local` and a cluster's ranks read
    datasets: $HVDK8S_CACHE_DIR, else ~/.cache/hvdk8s/datasets."""
    import datetime

    from rich.table import Table

    from hvdk8s.data import cache as dc
    from hvdk8s.data.cache.sizes import format_size
    from hvdk8s.data.datasets import cache_root

    dst = dst or str(cache_root())
    datasets = dc.list_datasets(dst)
    if not datasets:
        click.echo(f"no datasets in {dst}")
        return
    table = Table("key", "source", "version", "size", "files", "last used", "held", "complete", box=None)
    for d in datasets:
        used = datetime.datetime.fromtimestamp(d.last_used).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(d.key, d.source or "?", str(d.version or "-"), format_size(d.bytes), str(d.files), used,
                      _held(d.held, d.leased_until), "yes" if d.complete else "no")
    out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 1000)  # pipes get whole rows
    out.print(table, highlight=False, markup=False)


def _held(held: bool, leased_until: float | None) -> str:
    """`cache ls`'s held column: yes (a job holds it), leased until when, or no."""
    from hvdk8s.data.cache.store import format_time

    lease = None if leased_until is None else f"leased until {format_time(leased_until)}"
    if held:
        return "yes" + (f", {lease}" if lease else "")
    return lease or "no"


@cache.command("evict")
@click.argument("dst", type=click.Path(file_okay=False))
@click.argument("keys", nargs=-1)
@click.option("--quota", callback=_size, metavar="SIZE",
              help="Evict least recently used datasets until the cache holds at most SIZE (0: all not in use).")
def cache_evict(dst: str, keys: tuple[str, ...], quota: int | None) -> None:
    """Remove datasets from the cache at DST.

    The KEYs named, and/or down to --quota. Datasets held by running jobs, leased by a sync
    (`cache sync --lease`) until their lease ends, or being synced stay."""
    from hvdk8s.data import cache as dc
    from hvdk8s.data.cache.store import format_time

    if not keys and quota is None:
        raise UserError("name the datasets to evict (KEY ...) or give --quota SIZE (--quota 0 evicts every "
                        "dataset not in use)")
    removed = dc.evict(dst, keys=list(keys) or None, quota_bytes=quota)
    for key in removed:
        click.echo(f"evicted {key}")
    kept = [k for k in keys if k not in removed]
    for key in kept:
        until = dc.leased_until(dst, key)
        why = (f"is leased until {format_time(until)} (synced with --lease for a job whose ranks hold it later)"
               if until is not None else "is in use (held by a running job, or being synced)")
        err.print(f"[yellow]warning:[/] {escape(key)} {why}; not evicted", highlight=False)
    if kept:
        sys.exit(1)


@cache.command("warm")
@click.argument("job", type=click.Path(dir_okay=False))
@_set_option
def cache_warm(job: str, overrides: Sequence[str]) -> None:
    """Render a DaemonSet that fills the job's nodes' caches.

    It fills the node-local cache on the job's nodes before the MPIJob starts."""
    from hvdk8s.mpijob import render as renderer

    spec = _load(job, overrides)
    try:
        daemonset = renderer.warm_daemonset(spec)
    except ValueError as e:
        raise UserError(f"{job}: {e}") from None
    click.echo(renderer.to_yaml([daemonset]), nl=False)


@cache.command("manifest")
@click.argument("directory", type=click.Path(file_okay=False))
def cache_manifest(directory: str) -> None:
    """Write hvdk8s-manifest.json at DIRECTORY's root.

    It lists every file's path, size and sha256, so that DIRECTORY can be served over HTTP(S) as a
    dataset source."""
    from hvdk8s.data import cache as dc

    click.echo(str(dc.write_manifest(directory)))


@cli.command()
@click.option("--quick", is_flag=True, help="Small sizes, one repeat: a smoke run in seconds, not a measurement.")
@click.option("--only", multiple=True, metavar="NAMES",
              help=f"Run only these benchmarks (comma-separated or repeated): {', '.join(bench_run.BENCHMARKS)}.")
@_output_dir_option("Where results.json, README.md and the plots go (default: bench-results), or the rendered "
                    "MPIJobs with --render.")
@click.option("--render", "render_job", type=click.Path(dir_okay=False), metavar="JOB",
              help="Render the cluster benchmark for JOB's GPU nodes: two MPIJobs, with RDMA and without.")
@click.option("--from-logs", "logs", multiple=True, type=click.Path(dir_okay=False), metavar="LOG",
              help="Write the report of the cluster benchmark from its launchers' logs.")
@_set_option
def bench(quick: bool, only: Sequence[str], output_dir: str | None, old_output_dir: str | None,
          render_job: str | None, logs: Sequence[str], overrides: Sequence[str]) -> None:
    """Measure hvdk8s against baselines run beside it.

    Each result is a ratio against a baseline measured in the same run: the wrapper, the trainer, DDP
    and raw Horovod, allreduce with fp16, scaling, Horovod's knobs, TensorFlow, the input pipelines."""

    output = _output_dir(output_dir, old_output_dir, default="bench-results")

    if render_job and logs:
        raise UserError("--render, --from-logs: one at a time (render the jobs, run them, then read their logs)")
    if overrides and not render_job:
        raise UserError("--set: only with --render (it edits JOB)")
    if render_job:
        from hvdk8s.bench import cluster

        spec = _load(render_job, overrides)
        for path in cluster.render(spec, render_job, output):
            click.echo(str(path))
        return
    out = bench_run.prepare_output(output)
    if logs:
        from hvdk8s.bench import cluster, report

        report.write(out, cluster.comparisons(cluster.read_logs(list(logs))), {"source": "cluster logs"}, False)
        click.echo(str(out / "README.md"))
        return
    names = bench_run.chosen(only)
    bench_run.run(names, quick, out, lambda text: err.print(text, highlight=False, markup=False))
    click.echo(str(out / "README.md"))


for _command in cli_cluster.COMMANDS:  # status, logs, wait, list, delete
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="hvdk8s")
