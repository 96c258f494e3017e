"""The base of every validated settings model: unknown fields are errors (a typo never passes silently)
and a validated value cannot be changed afterwards."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
