"""The job as `hvdk8s validate --print` shows it: the canonical YAML (`spec.dump_job`, every default filled
in) with a comment on each field whose scope or origin would otherwise surprise: `gpus` counts the whole
job while cpu, memory and shm_size are each worker pod's, and which default image a job gets and how it
is built. Comments only: the output is still the job file, valid as it stands."""
from __future__ import annotations

import re

from hvdk8s.mpijob.topology import plan
from hvdk8s.spec import IMAGE_BUILDS, PER_WORKER_POD, JobSpec, default_image, dump_job

_KEY = re.compile(r"^( *)([A-Za-z_][\w-]*):(?: |$)")


def comments(spec: JobSpec) -> dict[str, str]:
    """{field path: comment} for the fields `annotated` explains."""
    topo = plan(spec.resources)
    pods = f"{topo.workers} worker pod{'s' if topo.workers != 1 else ''}"
    out = {f"resources.{f}": f"each worker pod's, not the job's total (this job: {pods})" for f in PER_WORKER_POD}
    out["resources.shm_size"] += "; memory-backed, it counts against memory"
    if spec.resources.gpus:
        out["resources.gpus"] = f"the whole job's: {pods} of {topo.gpus_per_worker} GPUs each"
    else:
        out["resources.gpus"] = f"the whole job's (0: a CPU job; {pods} of {topo.slots_per_worker} ranks each)"
    device = "gpu" if spec.resources.gpus else "cpu"
    if spec.image == default_image(spec.resources):
        build = IMAGE_BUILDS[device].format(image=spec.image)
        out["image"] = f"hvdk8s's default for a {device.upper()} job; built with: {build}"
    return out


def annotated(spec: JobSpec) -> str:
    """`dump_job(spec)` with `comments(spec)` at the end of their fields' lines."""
    notes = comments(spec)
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings the current line is in
    lines = []
    for line in dump_job(spec).splitlines():
        m = _KEY.match(line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(2)))
            note = notes.get(".".join(key for _, key in stack))
            if note:
                line += f"  # {note}"
        lines.append(line)
    return "\n".join(lines) + "\n"
