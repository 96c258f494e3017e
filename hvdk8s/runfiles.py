"""What a job writes into its run directory (`JobSpec.run_dir`: observability.dir, else the checkpoint
directory) besides checkpoints, and the Horovod environment that makes Horovod write it. Both back ends
(the local launch and the rendered MPIJob) set this environment on every rank: Horovod reads it at init,
before any of a user's code could."""
from __future__ import annotations

from hvdk8s.spec import AUTOTUNE_FILE, TIMELINE_FILE, JobSpec


def horovod_env(spec: JobSpec) -> dict[str, str]:
    o, env = spec.observability, {}
    if o.timeline:
        env["HOROVOD_TIMELINE"] = spec.run_file(TIMELINE_FILE)
    if o.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
        env["HOROVOD_AUTOTUNE_LOG"] = spec.run_file(AUTOTUNE_FILE)
    return env
