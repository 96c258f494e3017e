"""The benchmark users run on their own GPUs: `hvdk8s bench --render JOB -o DIR` turns a GPU job file
into two MPIJobs that run hvdk8s.bench.cluster_rank across its nodes, one with RDMA and one without
(the same pods otherwise); `hvdk8s bench --from-logs LOG...` reads their launchers' logs back into the
same report as a local run."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from hvdk8s.bench.allreduce import _label
from hvdk8s.bench.cluster_rank import MARK
from hvdk8s.bench.core import Comparison, Row
from hvdk8s.errors import UserError
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
    from hvdk8s.mpijob import render as renderer

    written = []
    for label, job in bench_jobs(spec, source).items():
        written += renderer.write_directory(job, str(Path(output) / label), {})
    return written


def read_logs(paths: list[str]) -> list[dict]:
    """The results rank 0 printed, one per log (kubectl logs or `hvdk8s logs --raw` of each launcher)."""
    results = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror})") from None
        found = None
        for line in text.splitlines():
            at = line.find(MARK)  # mpirun may put a rank tag in front (and another after)
            if at >= 0:
                try:
                    found, _ = json.JSONDecoder().raw_decode(line[at + len(MARK):])
                except json.JSONDecodeError:
                    continue
        if not isinstance(found, dict) or not {"label", "allreduce", "samples_per_s"} <= found.keys():
            raise UserError(f"{path}: no benchmark result in this log (a line starting {MARK.strip()!r} from "
                            "the launcher of a job rendered by `hvdk8s bench --render`)")
        results.append(found)
    return results


def comparisons(results: list[dict]) -> list[Comparison]:
    labels = [r["label"] for r in results]
    baseline = "tcp" if "tcp" in labels else labels[0]
    allreduce, training = [], []
    for r in results:
        a, factor = r["allreduce"], 2 * (r["ranks"] - 1) / max(r["ranks"], 1)
        for i, size in enumerate(a["sizes"]):
            for comp in ("fp32", "fp16"):
                allreduce.append(Row(config=f"{r['label']} {comp}", group=_label(size), x=float(size),
                                     samples=[size / a[comp][i] / 1e9 * factor]))
        for model, rate in r["samples_per_s"].items():
            training.append(Row(config=r["label"], group=model, samples=[rate]))
    shape = f"{results[0]['ranks']} ranks on {results[0]['nodes']} nodes"
    return [Comparison("cluster_allreduce", f"Allreduce bus bandwidth, {shape}", "GB/s", True, f"{baseline} fp32",
                       allreduce, plot="line", x_label="tensor size (bytes)"),
            Comparison("cluster_training", f"Training samples/s, {shape}", "samples/s", True, baseline, training,
                       target="RDMA well above TCP across nodes (the reference talk reports about 5x)")]
