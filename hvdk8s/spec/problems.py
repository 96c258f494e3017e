"""Every problem of a job file as (field path, message): pydantic's errors rewritten to name the field
(`training.batch_size`), say what is allowed there, and suggest the nearest name or choice for a typo."""
from __future__ import annotations

import datetime
import re
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from hvdk8s.core import suggest
from hvdk8s.core.errors import UserError


class JobFileError(UserError):
    """A job file that cannot be used; `problems` lists (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        super().__init__(f"{source}: invalid job file", problems)


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed at `loc` (for 'unknown field' messages)."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        ann = getattr(field, "annotation", None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return list(model.model_fields)


def _choices(error: dict) -> list[str]:
    """The values a Literal field allows, from pydantic's error (`'sgd', 'adam' or 'adamw'`)."""
    return re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))


def _unquoted(value: Any) -> Optional[str]:
    """For a text field given what YAML reads an unquoted date, number or yes/no as: say to quote it."""
    if isinstance(value, bool):
        return "YAML reads an unquoted true/false, yes/no or on/off as a boolean, not text: quote it"
    if isinstance(value, datetime.date):
        return f'YAML reads an unquoted {value.isoformat()} as a date, not text: quote it ("{value.isoformat()}")'
    if isinstance(value, (int, float)):
        return (f"YAML reads this unquoted value as the number {value!r}, not text (1.10 reads as 1.1, 010 as 8): "
                "quote it as you wrote it")
    return None


def field_problems(err: ValidationError, model: type[BaseModel], prefix: tuple = ()) -> list[tuple[str, str]]:
    """ERR as (field path, message) pairs; PREFIX places a nested model's errors (a model's own `args`)."""
    out = []
    for e in err.errors(include_url=False):
        if e["type"] == "default_factory_not_called":
            continue  # a default derived from other fields (image, shm_size), which have their own errors
        loc = prefix + tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(model, tuple(e["loc"])[:-1])
            msg = "unknown field" + (f"; {suggest.hint(loc[-1], allowed, 'allowed here')}" if allowed else "")
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "literal_error" and (meant := suggest.closest(str(e["input"]), _choices(e))):
            msg = f"{e['input']!r} is not a choice here; did you mean {meant!r}?"
        elif e["type"] == "string_type" and _unquoted(e["input"]):
            msg = _unquoted(e["input"])
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] not in ("value_error", "assertion_error") and "input" in e:
                msg += f" (got {e['input']!r})"
        out.append((_path(loc), msg))
    return out
