"""A job file read, overridden (`--set`), validated and written back: `load_job` for a path (or the bytes
`read_job_file` read of it), `parse_job` for a document already read, `dump_job` for the canonical YAML,
and `current_job` for the job a rank runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import ValidationError

from hvdk8s.core import safeyaml
from hvdk8s.data import catalog
from hvdk8s.models import registry
from hvdk8s.overrides import OverrideError, applied
from hvdk8s.spec.job import JobSpec
from hvdk8s.spec.problems import JobFileError, field_problems
from hvdk8s.spec.workload import TRAINER_REQUIRED

# Every rank finds its validated job (defaults filled in) at the path this variable names: a file the
# local launcher writes, or the job's ConfigMap on a cluster. `hvdk8s.job()` reads it.
JOB_ENV = "HVDK8S_JOB"


def _cross_checks(spec: JobSpec) -> list[tuple[str, str]]:
    """Rules that span fields: each model's and dataset's own arguments, and their pairing."""
    problems = []
    if spec.entrypoint is None:
        problems += [(f"training.{f}", "required field is missing (hvdk8s's trainer reads it; only a script job, "
                                       "with `entrypoint`, may leave it out)")
                     for f in TRAINER_REQUIRED if getattr(spec.training, f) is None]
    if spec.run_dir is None:
        problems += [(f"observability.{f}", "needs a run directory: set observability.dir (or "
                                            "training.checkpoint.dir)") for f in spec.observability.wanted]
    m = spec.observability.metrics
    if m.pod_monitor and m.enabled is False:
        problems.append(("observability.metrics.pod_monitor", "a PodMonitor scrapes the ranks' metrics, which "
                                                              "observability.metrics.enabled: false turns off; "
                                                              "drop one of the two"))
    if spec.training.compression == "powersgd":
        if spec.training.shard_optimizer_state:
            problems.append(("training.compression", "powersgd and training.shard_optimizer_state: one or the "
                                                     "other (a sharded optimizer reduce-scatters whole gradients)"))
    elif spec.training.powersgd is not None:
        problems.append(("training.powersgd", f"applies only with training.compression: powersgd (it is "
                                              f"{spec.training.compression})"))
    entry = registry.get(spec.model.name) if spec.model is not None and spec.model.name else None
    if entry is not None:
        try:
            entry.args(**spec.model.args)
        except ValidationError as e:
            problems += field_problems(e, entry.args, ("model", "args"))
        if spec.framework not in entry.builders:
            problems.append(("framework", f"model {entry.name!r} is not yet available for {spec.framework} "
                                          f"(available for: {', '.join(sorted(entry.builders))})"))
    if spec.dataset is not None and spec.dataset.name:
        args_model, task = catalog.BUILTIN[spec.dataset.name]
        try:
            args_model(**spec.dataset.args)
        except ValidationError as e:
            problems += field_problems(e, args_model, ("dataset", "args"))
        model_task = spec.model.resolved_task if spec.model is not None else task
        if task != model_task:
            problems.append(("dataset.name", f"dataset {spec.dataset.name!r} feeds {task.replace('_', ' ')} "
                                             f"models, but model {spec.model.label!r} is a "
                                             f"{model_task.replace('_', ' ')} model"))
    return problems


def parse_job(data: Any, source: str = "<job>") -> JobSpec:
    """Validate an already-loaded job document (a dict)."""
    if not isinstance(data, dict):
        raise JobFileError(source, [("", f"expected a mapping of fields, got {type(data).__name__}")])
    try:
        spec = JobSpec(**data)
    except ValidationError as e:
        raise JobFileError(source, field_problems(e, JobSpec)) from None
    problems = _cross_checks(spec)
    if problems:
        raise JobFileError(source, problems)
    return spec


def apply_overrides(data: dict, overrides: list[str], source: str) -> dict:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a job document, returning a copy."""
    try:
        return applied(data, overrides)
    except OverrideError as e:
        raise JobFileError(source, [(e.field, e.message)]) from None


def read_job_file(path: Union[str, Path], max_bytes: int = safeyaml.MAX_BYTES) -> bytes:
    """The bytes of a job file, at most max_bytes + 1 (more is refused when parsed). Raises JobFileError for
    a file that cannot be read."""
    source = str(Path(path))
    try:
        return safeyaml.read_bytes(path, max_bytes)
    except FileNotFoundError:
        raise JobFileError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise JobFileError(source, [("", "is a directory, not a job file")]) from None
    except OSError as e:
        raise JobFileError(source, [("", f"cannot read: {e.strerror or e}")]) from None


def load_job(path: Union[str, Path], overrides: Optional[list[str]] = None, raw: Optional[bytes] = None) -> JobSpec:
    """Read and validate a job file, or its bytes `raw` already read (`read_job_file`). Raises JobFileError
    (never a bare YAML or pydantic error)."""
    path = Path(path)
    source = str(path)
    try:
        docs = safeyaml.loads(read_job_file(path) if raw is None else raw)
    except safeyaml.YAMLInputError as e:
        raise JobFileError(source, [("", str(e))]) from None
    if len(docs) != 1:
        raise JobFileError(source, [("", f"expected exactly one YAML document, found {len(docs)}")])
    data = docs[0]
    if overrides:
        if not isinstance(data, dict):
            raise JobFileError(source, [("", "expected a mapping of fields")])
        data = apply_overrides(data, overrides, source)
    return parse_job(data, source)


def dump_job(spec: JobSpec) -> str:
    """The job as canonical YAML (defaults filled in, stable key order)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


_current: dict[str, JobSpec] = {}


def current_job() -> JobSpec:
    """The job this process runs as a rank of (see JOB_ENV); read and validated once per process."""
    import os

    path = os.environ.get(JOB_ENV)
    if not path:
        raise JobFileError(JOB_ENV, [("", "not set: start this script through `hvdk8s launch` (locally: "
                                          "--local -np N) or a rendered MPIJob, or set it to a job file")])
    if path not in _current:
        _current[path] = load_job(path)
    return _current[path]
