"""A job's own entrypoint (`entrypoint.script` or `.module`): the argv each rank runs, here and on a
cluster, and the script text a cluster gets through the job's ConfigMap.

A relative `script` is relative to the job file's folder, as a path in a Makefile or compose file is;
with `code: image` it is the script's path inside the image on a cluster.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from hvdk8s.spec import JobFileError, JobSpec

MAX_CARRIED_BYTES = 512 * 1024  # a ConfigMap holds at most 1 MiB, the job file included
PYTHON_IN_IMAGE = "python"  # the image's venv is first on PATH (Dockerfile.gpu)
RANK_MAIN = "hvdk8s.rankmain"  # runs the script with whole-line writes (see there)


def local_script(spec: JobSpec, job_dir: Path, source: str) -> Path:
    """The script on this machine; JobFileError naming `entrypoint.script` if it is not a readable file."""
    path = Path(spec.entrypoint.script)
    path = path if path.is_absolute() else Path(job_dir) / path
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise JobFileError(source, [("entrypoint.script", f"{path} {what}")])
    return path.resolve()


def local_argv(spec: JobSpec, job_dir: Path, source: str) -> list[str]:
    """What each local rank runs, with this interpreter."""
    e = spec.entrypoint
    if e.module is not None:
        return [sys.executable, "-m", RANK_MAIN, "--module", e.module, *e.args]
    return [sys.executable, "-m", RANK_MAIN, "--script", str(local_script(spec, job_dir, source)), *e.args]


def cluster_argv(spec: JobSpec, carried_dir: str) -> list[str]:
    """What each rank runs in the image: the carried script under `carried_dir`, or code in the image."""
    e = spec.entrypoint
    if e.module is not None:
        return [PYTHON_IN_IMAGE, "-m", RANK_MAIN, "--module", e.module, *e.args]
    script = f"{carried_dir}/{e.script_name}" if e.carried else e.script
    return [PYTHON_IN_IMAGE, "-m", RANK_MAIN, "--script", script, *e.args]


def carried_files(spec: JobSpec, job_dir: Optional[Path], source: str) -> dict[str, str]:
    """{ConfigMap key: text} of the script a cluster gets through the job's ConfigMap (none if in the image)."""
    if spec.entrypoint is None or not spec.entrypoint.carried:
        return {}
    path = local_script(spec, job_dir or Path.cwd(), source)
    size = path.stat().st_size
    if size > MAX_CARRIED_BYTES:
        raise JobFileError(source, [("entrypoint.script", f"{path} is {size} bytes; a ConfigMap carries at most "
                                                          f"{MAX_CARRIED_BYTES} (use `code: image`)")])
    try:
        return {spec.entrypoint.script_name: path.read_text(encoding="utf-8")}
    except UnicodeDecodeError:
        raise JobFileError(source, [("entrypoint.script", f"{path} is not UTF-8 text")]) from None
    except OSError as e:
        raise JobFileError(source, [("entrypoint.script", f"cannot read {path}: {e.strerror}")]) from None
