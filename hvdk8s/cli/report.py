"""The command's one stderr console, and how an error reaches it. Text from users (paths, fields, messages,
names) is escaped before it joins markup, and emoji codes are off: a `:smile:` in a path prints as typed."""
from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.markup import escape

from hvdk8s.core.errors import UserError

err = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)  # long field paths stay whole for grep


class Failed(Exception):
    """A verb's end that is not the user's input to fix (the ranks failed; hvdk8s itself did wrong): the
    handler prints `label: message`, then each of `details` as it is, and exits with `status`."""

    def __init__(self, status: int, message: str, details: Sequence[str] = (), label: str = "error"):
        super().__init__(message)
        self.status, self.message, self.details, self.label = status, message, list(details), label


def user_error(e: UserError) -> None:
    """The header, then every problem with its field path."""
    err.print(f"[bold red]error:[/] {escape(e.header)}")
    for path, msg in e.problems:
        err.print(f"  [bold]{escape(path or '(top level)')}[/]: {escape(msg)}")


def failure(e: Failed) -> None:
    err.print(f"[bold red]{e.label}:[/] {escape(e.message)}")
    for line in e.details:
        err.print(line, markup=False)


def note(text: str) -> None:
    err.print("[yellow]note:[/] " + escape(text))


def warning(text: str) -> None:
    err.print("[yellow]warning:[/] " + escape(text))


def note_pod_security(spec) -> None:
    """The Pod Security level a job's pods need, when it is more than restricted (validate, render, launch)."""
    from hvdk8s.mpijob.podsecurity import level_note

    text = level_note(spec)
    if text:
        note(text)
