"""Options more than one verb takes, spelt and checked one way."""
from __future__ import annotations

import re
from typing import Any, Optional

import click

from hvdk8s import logformat
from hvdk8s.cli import report
from hvdk8s.core import suggest
from hvdk8s.core.errors import UserError

set_option = click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
                          help="Override a job-file field, e.g. --set training.epochs=3 (repeatable).")

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def duration(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[float]:
    """`90`, `90s`, `10m`, `1h30m` as seconds."""
    if value is None:
        return None
    m = _DURATION.match(value.strip())
    if not value.strip() or not m:
        raise click.BadParameter(f"{value!r} is not a duration: write 90, 90s, 10m or 1h30m")
    hours, minutes, seconds = m.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def output_dir_option(help: str):
    """`-d/--output-dir DIR`. `-o/--output DIR`, its old spelling, still works (hidden, with a note): in
    the other verbs, as in kubectl, -o is the output format."""
    def decorate(f):
        f = click.option("-o", "--output", "old_output_dir", hidden=True, type=click.Path(file_okay=False))(f)
        return click.option("-d", "--output-dir", "output_dir", type=click.Path(file_okay=False), metavar="DIR",
                            help=help)(f)
    return decorate


def chosen_output_dir(output_dir: str | None, old_output_dir: str | None, default: str | None = None) -> str | None:
    """The folder given with -d/--output-dir, or with the old -o/--output (noted on stderr)."""
    if old_output_dir is None:
        return default if output_dir is None else output_dir
    if output_dir is not None:
        raise UserError("-o/--output, -d/--output-dir: one folder at a time (-o DIR is the old spelling of -d DIR)")
    report.note("-o/--output DIR is now -d/--output-dir DIR (-o is the output format in the other verbs, as in "
                "kubectl); -o DIR still works here for now")
    return old_output_dir


def target_options(namespace_default: str = "the context's, else \"default\""):
    """Where a cluster job lives, as kubectl users say it; -n's help says where its default comes from."""
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
