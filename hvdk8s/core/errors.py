"""The base of every error a user can fix (a job file, a field, a path, a URL, a missing tool): the CLI
reports it in one place, as a header and (field path, message) lines, and exits 2, never a traceback."""
from __future__ import annotations

from typing import Sequence


class UserError(Exception):
    """`header` says what failed; `problems` lists (field path or file, message) pairs, if any."""

    def __init__(self, header: str, problems: Sequence[tuple[str, str]] = ()):
        self.header = header
        self.problems = list(problems)
        lines = "".join(f"\n  {path or '(top level)'}: {msg}" for path, msg in self.problems)
        super().__init__(header + lines)
