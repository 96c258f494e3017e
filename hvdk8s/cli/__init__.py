"""The `hvdk8s` command, one module per verb group: `jobfile` (validate, render), `run` (launch, train),
`cluster` (status, logs, wait, list, delete; `cluster_launch` is launch's cluster half), `datasets`
(cache), `benchmarks` (bench). Each verb is a thin call into a module; an error reaches one handler
(`group.Verbs.invoke`), which prints it on the one console (`report`) and exits, never a traceback."""
from __future__ import annotations

import click

from hvdk8s import __version__
from hvdk8s.cli import benchmarks, cluster, datasets, jobfile, run
from hvdk8s.cli.group import Verbs
from hvdk8s.core.exiting import exit_at_once


@click.group(cls=Verbs, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hvdk8s")
def cli() -> None:
    """Run Horovod training jobs on this machine or a Kubernetes cluster, from one job file."""


for _verb in (jobfile.validate, run.train, run.launch, jobfile.render, datasets.cache, benchmarks.bench,
              cluster.status, cluster.logs, cluster.wait, cluster.list_jobs, cluster.delete):
    cli.add_command(_verb)


def main() -> None:
    """The `hvdk8s` command: the verb, then an exit without the interpreter's teardown (exit_at_once)."""
    try:
        cli(prog_name="hvdk8s")
    except SystemExit as e:  # click's standalone mode ends every verb so, with its status
        exit_at_once(e.code)
    exit_at_once(0)
