"""'Did you mean': for a name typed wrong (a field, a choice, a model), the one allowed name close to it,
rather than every name allowed there. Only when none is close does a message list them all."""
from __future__ import annotations

import difflib
from typing import Iterable, Optional


def closest(word: str, names: Iterable[str]) -> Optional[str]:
    """The allowed name most like `word`, if any is close enough to be what was meant."""
    found = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def hint(word: object, names: Iterable[str], listing: str, quote: bool = False) -> str:
    """`did you mean NAME?` when a name is close to `word`, else `LISTING: every, name` (quoted with
    `quote`, as a choice of values is written)."""
    names = list(names)
    show = repr if quote else str
    match = closest(word, names) if isinstance(word, str) else None
    if match is not None:
        return f"did you mean {show(match)}?"
    return f"{listing}: {', '.join(map(show, names))}"
