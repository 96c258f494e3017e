"""What a job writes into its run directory (`JobSpec.run_dir`: observability.dir, else the checkpoint
directory) besides checkpoints, and the Horovod environment that makes Horovod write it. Both back ends
(the local launch and the rendered MPIJob) set this environment on every rank: Horovod reads it at init,
before any of a user's code could. The trainer also writes TensorBoard's scalars there (a sink of rank 0's
events) and ends with a "file" event per file, saying where it is and how to open it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from hvdk8s.spec import AUTOTUNE_FILE, TENSORBOARD_DIR, TIMELINE_FILE, JobSpec
from hvdk8s.tensorboard import Scalars

FILES = {"timeline": TIMELINE_FILE, "autotune": AUTOTUNE_FILE, "tensorboard": TENSORBOARD_DIR}  # switch -> name


def horovod_env(spec: JobSpec) -> dict[str, str]:
    o, env = spec.observability, {}
    if o.timeline:
        env["HOROVOD_TIMELINE"] = spec.run_file(TIMELINE_FILE)
    if o.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
        env["HOROVOD_AUTOTUNE_LOG"] = spec.run_file(AUTOTUNE_FILE)
    return env


def make_dirs(environ: Mapping[str, str] = os.environ) -> None:
    """Create the folders of the files Horovod opens at init (it creates none, and without one it writes no
    timeline or autotune log, with a log line as the only sign). Before hvd.init(): the trainer calls it,
    and so does hvdk8s.rankmain for a job's own script."""
    for var in ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG"):
        path = environ.get(var)
        if path and path != "DYNAMIC":  # DYNAMIC: a timeline started later, by hvd.start_timeline(path)
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def sinks(spec: JobSpec) -> list:
    """Where rank 0's events go besides its output (`events.Reporter(sinks=...)`): TensorBoard's scalars."""
    if not spec.observability.tensorboard:
        return []
    return [Scalars(spec.run_file(TENSORBOARD_DIR))]


def written(spec: JobSpec) -> dict[str, str]:
    """{switch: absolute path} of what the job's switches write, for rank 0's closing "file" events."""
    o = spec.observability
    return {what: os.path.abspath(spec.run_file(name)) for what, name in FILES.items() if getattr(o, what)}
