"""`hvdk8s bench`: hvdk8s measured against baselines run beside it, here or (rendered, then read from
the launchers' logs) on a cluster."""
from __future__ import annotations

from typing import Sequence

import click

from hvdk8s.bench import run as bench_run
from hvdk8s.bench.core import BenchError
from hvdk8s.cli.group import verb
from hvdk8s.cli.jobs import load
from hvdk8s.cli.options import chosen_output_dir, output_dir_option, set_option
from hvdk8s.cli.report import Failed, err
from hvdk8s.core.errors import UserError


@verb()
@click.option("--quick", is_flag=True, help="Small sizes, one repeat: a smoke run in seconds, not a measurement.")
@click.option("--only", multiple=True, metavar="NAMES",
              help=f"Run only these benchmarks (comma-separated or repeated): {', '.join(bench_run.BENCHMARKS)}.")
@output_dir_option("Where results.json, README.md and the plots go (default: bench-results), or the rendered "
                   "MPIJobs with --render.")
@click.option("--render", "render_job", type=click.Path(dir_okay=False), metavar="JOB",
              help="Render the cluster benchmark for JOB's GPU nodes: two MPIJobs, with RDMA and without.")
@click.option("--from-logs", "logs", multiple=True, type=click.Path(dir_okay=False), metavar="LOG",
              help="Write the report of the cluster benchmark from its launchers' logs.")
@set_option
def bench(quick: bool, only: Sequence[str], output_dir: str | None, old_output_dir: str | None,
          render_job: str | None, logs: Sequence[str], overrides: Sequence[str]) -> None:
    """Measure hvdk8s against baselines run beside it.

    Each result is a ratio against a baseline measured in the same run: the wrapper, the trainer, DDP
    and raw Horovod, allreduce with fp16, scaling, Horovod's knobs, TensorFlow, the input pipelines."""

    output = chosen_output_dir(output_dir, old_output_dir, default="bench-results")

    if render_job and logs:
        raise UserError("--render, --from-logs: one at a time (render the jobs, run them, then read their logs)")
    if overrides and not render_job:
        raise UserError("--set: only with --render (it edits JOB)")
    if render_job:
        from hvdk8s.bench import cluster

        spec = load(render_job, overrides)
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
    try:
        bench_run.run(names, quick, out, lambda text: err.print(text, markup=False))
    except BenchError as e:  # a baseline's or hvdk8s's ranks failed: their output, not our traceback
        first, *rest = str(e).splitlines() or ["a benchmark failed"]
        raise Failed(1, first, rest, label="benchmark failed") from None
    click.echo(str(out / "README.md"))
