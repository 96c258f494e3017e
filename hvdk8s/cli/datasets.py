"""`hvdk8s cache`: the verbs of the node-local dataset cache (sync, ls, evict, warm, manifest)."""
from __future__ import annotations

import sys
from typing import Sequence

import click
from rich.console import Console

from hvdk8s.cli import report
from hvdk8s.cli.group import Verbs
from hvdk8s.cli.jobs import load
from hvdk8s.cli.options import duration, set_option
from hvdk8s.core.errors import UserError


@click.group(cls=Verbs)
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
@click.option("--lease", callback=duration, metavar="DURATION",
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
def cache_evict(dst: str, keys: tuple[str, ...], quota: int | None) -> int:
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
        report.warning(f"{key} {why}; not evicted")
    return 1 if kept else 0  # some named datasets stayed


@cache.command("warm")
@click.argument("job", type=click.Path(dir_okay=False))
@set_option
def cache_warm(job: str, overrides: Sequence[str]) -> None:
    """Render a DaemonSet that fills the job's nodes' caches.

    It fills the node-local cache on the job's nodes before the MPIJob starts."""
    from hvdk8s.mpijob import render as renderer

    spec = load(job, overrides)
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
