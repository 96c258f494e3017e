"""A job file as the verbs take it: valid, within the size the ranks can receive, its code checked."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from hvdk8s.spec import JobFileError, JobSpec, load_job


def load(job: str, overrides: Sequence[str], raw: Optional[bytes] = None) -> JobSpec:
    """The job (from `raw`, its file's bytes, when the verb read them already), valid and within the size
    the ranks can receive (`hvdk8s.jobsize`)."""
    from hvdk8s import jobsize

    spec = load_job(job, list(overrides), raw)
    too_large = jobsize.problems(spec)
    if too_large:
        raise JobFileError(job, too_large)
    return spec


def check_code(spec: JobSpec, job: str) -> None:
    """The job's factories and carried script, as a rank will meet them (`hvdk8s.preflight.check_code`)."""
    from hvdk8s.preflight import check_code

    check_code(spec, Path(job).parent, job)
