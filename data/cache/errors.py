"""The one exception the cache raises for anything a user can act on."""
from __future__ import annotations

from hvdk8s.errors import UserError


class CacheError(UserError):
    """A sync, eviction or manifest that cannot be done; the message names the file or dataset and what to do."""

    def __init__(self, message: str):
        super().__init__(message)
