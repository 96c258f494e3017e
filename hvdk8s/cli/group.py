"""The click classes of the `hvdk8s` verbs, and the one place a verb ends in error: a `UserError` exits 2
(never a traceback), a `report.Failed` its status, and a verb that returns a job's exit status exits
with it. Verbs raise or return; none prints its own error or exits."""
from __future__ import annotations

import sys

import click

from hvdk8s.cli import report
from hvdk8s.core.errors import UserError


class Verb(click.Command):
    """A verb whose "did you mean" offers only the options its --help shows, not an old spelling kept
    hidden (render's -o DIR)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            hidden = {o for p in self.params if getattr(p, "hidden", False) for o in p.opts + p.secondary_opts}
            e.possibilities = [o for o in e.possibilities or () if o not in hidden]
            raise


class Verbs(click.Group):
    """A group of verbs (the command, `cache`), ending each as the module says, for `main` and in-process
    runners alike."""

    command_class = Verb

    def invoke(self, ctx: click.Context):
        try:
            status = super().invoke(ctx)
        except UserError as e:
            report.user_error(e)
            sys.exit(2)
        except report.Failed as e:
            report.failure(e)
            sys.exit(e.status)
        if status:
            sys.exit(status)
        return status


def verb(name: str | None = None):
    """A verb of its own module, added to its group later."""
    return click.command(name, cls=Verb)
