"""The one exception the cache raises for anything a user can act on."""
from __future__ import annotations


class CacheError(Exception):
    """A sync, eviction or manifest that cannot be done; the message names the file or dataset and what to do."""
