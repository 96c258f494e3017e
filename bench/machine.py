"""The machine a report was measured on: CPU, cores, memory, the versions that matter, and what was measured:
the commit (with `+changes` when the work tree differed from it) and the tuning profile hvdk8s's ranks ran with."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from hvdk8s import tuning


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1)
    except (ValueError, OSError):
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _mpirun_version() -> str | None:
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


def _gpu() -> str | None:
    """The GPUs nvidia-smi lists (name, driver), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return "; ".join(line.strip() for line in out.splitlines() if line.strip()) or None


def _commit() -> str | None:
    """The repository commit of this hvdk8s; an installed copy outside a clone has none, unless
    HVDK8S_COMMIT names it (a copy of the work tree measured on another machine: scripts/gpu-check.sh)."""
    if os.environ.get("HVDK8S_COMMIT"):
        return os.environ["HVDK8S_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _tuning() -> str:
    """The profile `launch --local` gives the benchmarks' hvdk8s ranks here (hvdk8s/tuning.py)."""
    return tuning.resolve("auto", tuning.gpus_visible(os.environ))


def describe() -> dict:
    return {
        "commit": _commit(), "tuning": _tuning(),
        "cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(), "gpu": _gpu(),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "torch": _version("torch"), "tensorflow": _version("tensorflow-cpu") or _version("tensorflow"),
        "keras": _version("keras"), "horovod": _version("horovod"), "mpi": _mpirun_version(),
        "hvdk8s": _version("hvdk8s"),
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
