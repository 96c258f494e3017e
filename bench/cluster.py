"""The benchmark users run on their own GPUs: `hvdk8s bench --render JOB -d DIR` turns a GPU job file
into two MPIJobs that run hvdk8s.bench.cluster_rank across its nodes, one with RDMA and one without
(the same pods otherwise); `hvdk8s bench --from-logs LOG...` reads their launchers' logs back into the
same report as a local run."""
from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from hvdk8s.bench.allreduce import size_label
from hvdk8s.bench.cluster_rank import MARK
from hvdk8s.bench.core import Comparison, Row
from hvdk8s.core.errors import UserError
from hvdk8s.mpijob import render as renderer
from hvdk8s.spec import JobFileError, JobSpec, dump_job, parse_job

VARIANTS = (("rdma", True), ("tcp", False))


def bench_jobs(spec: JobSpec, source: str) -> dict[str, JobSpec]:
    """{label: job}: `spec`'s pods, image and placement running the benchmark, with RDMA and without."""
    problems = []
    if not spec.resources.gpus:
        problems.append(("resources.gpus", "the cluster benchmark measures GPU nodes; this is a CPU job"))
    if not spec.resources.rdma.enabled:
        problems.append(("resources.rdma.enabled", "set it (with your cluster's rdma resource): the benchmark "
                                                   "runs once with RDMA and once without"))
    if problems:
        raise JobFileError(source, problems)
    base = yaml.safe_load(dump_job(spec))
    jobs = {}
    for label, rdma in VARIANTS:
        data = copy.deepcopy(base)
        data["name"] = f"{spec.name}-bench-{label}"
        data["entrypoint"] = {"module": "hvdk8s.bench.cluster_rank", "args": [label], "code": "image"}
        data.pop("model", None)
        data.pop("dataset", None)
        data["training"]["checkpoint"] = {"dir": None}
        data["resources"]["rdma"]["enabled"] = rdma
        if not rdma:
            data["resources"]["hierarchical_allreduce"] = False
        jobs[label] = parse_job(data, f"{source} (benchmark, {label})")
    return jobs


def render(spec: JobSpec, source: str, output: str) -> list[Path]:
    written = []
    for label, job in bench_jobs(spec, source).items():
        written += renderer.write_directory(job, str(Path(output) / label), {})
    return written


Seconds = Annotated[float, Field(ge=1e-12, le=1e6, allow_inf_nan=False)]
Rate = Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False)]


class _Sweep(BaseModel):
    sizes: list[Annotated[int, Field(gt=0, le=1 << 50)]]
    fp32: list[Seconds]
    fp16: list[Seconds]

    @model_validator(mode="after")
    def _one_time_per_size(self) -> "_Sweep":
        if not len(self.sizes) == len(self.fp32) == len(self.fp16):
            raise ValueError("sizes, fp32 and fp16 must have one entry per size")
        return self


class ClusterResult(BaseModel):
    """What hvdk8s.bench.cluster_rank prints: checked, since a log is any file a user hands in."""

    label: str
    ranks: Annotated[int, Field(gt=0, le=1 << 24)]
    nodes: Annotated[int, Field(gt=0, le=1 << 24)]
    allreduce: _Sweep
    samples_per_s: dict[str, Rate]


def read_logs(paths: list[str]) -> list[ClusterResult]:
    """The result rank 0 printed, one per log (kubectl logs or `hvdk8s logs --raw` of each launcher)."""
    results = []
    for path in paths:
        found = None
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:  # a line at a time: launcher logs can be long
                    at = line.find(MARK)  # mpirun may put a rank tag in front (and another after)
                    if at >= 0:
                        with contextlib.suppress(json.JSONDecodeError):
                            found, _ = json.JSONDecoder().raw_decode(line[at + len(MARK):])
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror})") from None
        if found is None:
            raise UserError(f"{path}: no benchmark result in this log (a line starting {MARK.strip()!r} from "
                            "the launcher of a job rendered by `hvdk8s bench --render`)")
        try:
            results.append(ClusterResult.model_validate(found))
        except ValidationError as e:
            raise UserError(f"{path}: the benchmark result is malformed",
                            [(".".join(map(str, err["loc"])) or "(result)", err["msg"]) for err in e.errors()]) from None
    return results


def comparisons(results: list[ClusterResult]) -> list[Comparison]:
    labels = [r.label for r in results]
    baseline = "tcp" if "tcp" in labels else labels[0]
    allreduce, training = [], []
    for r in results:
        a, factor = r.allreduce, 2 * (r.ranks - 1) / r.ranks
        for size, *seconds in zip(a.sizes, a.fp32, a.fp16):
            for comp, s in zip(("fp32", "fp16"), seconds):
                allreduce.append(Row(config=f"{r.label} {comp}", group=size_label(size), x=float(size),
                                     samples=[size / s / 1e9 * factor]))
        for model, rate in r.samples_per_s.items():
            training.append(Row(config=r.label, group=model, samples=[rate]))
    shape = f"{results[0].ranks} ranks on {results[0].nodes} nodes"
    return [Comparison("cluster_allreduce", f"Allreduce bus bandwidth, {shape}", "GB/s", True, f"{baseline} fp32",
                       allreduce, plot="line", x_label="tensor size (bytes)"),
            Comparison("cluster_training", f"Training samples/s, {shape}", "samples/s", True, baseline, training,
                       target="RDMA well above TCP across nodes (the reference talk reports about 5x)")]
