"""The one exception the cache raises for anything a user can act on, and how its messages show names."""
from __future__ import annotations

from hvdk8s.core.errors import UserError


class CacheError(UserError):
    """A sync, eviction or manifest that cannot be done; the message names the file or dataset and what to do."""

    def __init__(self, message: str):
        super().__init__(message)


def shown(name: str) -> str:
    """A file name quoted, with anything unprintable escaped: a newline, a space at the end or the lone
    surrogates that stand for bytes that are not UTF-8 stay visible and never garble the terminal."""
    return repr(name)


def plain(text: str) -> str:
    """`text` as it is when it prints cleanly, else quoted as `shown` does."""
    return text if text.isprintable() else repr(text)
