"""By-hand check on the 1.35 stack (issue 28), not a test: every golden job's MPIJob and its pods (as
hvdk8s.mpijob.operator models what mpi-operator creates) sent to the real API server with
`--dry-run=server`, in namespaces that enforce each Pod Security level, and compared with hvdk8s's own
checker (hvdk8s.mpijob.podsecurity.level). Prints one line per pod and level, and every disagreement.

    KUBECONFIG=STATE/kubeconfig .venv/bin/python scripts/k8s/podsecurity-135.py    (a cluster from start-135.sh)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hvdk8s.mpijob import operator, podsecurity, render
from hvdk8s.spec import load_job

ROOT = Path(__file__).resolve().parents[2]

LEVELS = ("privileged", "baseline", "restricted")


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True)


_made: set[tuple[str, str]] = set()


def prerequisites(pod: dict) -> None:
    """The objects a job names and the admission plugins look up (ServiceAccount, Priority): the golden
    jobs name a ServiceAccount and PriorityClasses that a real cluster must have; made here once each."""
    spec = pod.get("spec") or {}
    sa, pc = spec.get("serviceAccountName"), spec.get("priorityClassName")
    for level in LEVELS:
        if sa and ("sa", f"{level}/{sa}") not in _made:
            kubectl("-n", f"psa-{level}", "create", "serviceaccount", sa)
            _made.add(("sa", f"{level}/{sa}"))
    if pc and ("pc", pc) not in _made:
        kubectl("create", "priorityclass", pc, "--value=1000")
        _made.add(("pc", pc))


def main() -> int:
    for level in LEVELS:
        ns = f"psa-{level}"
        kubectl("create", "namespace", ns)
        kubectl("label", "--overwrite", "namespace", ns, f"pod-security.kubernetes.io/enforce={level}")
    disagreements = 0
    for case in sorted(p.name for p in (ROOT / "tests" / "golden").iterdir() if (p / "job.yaml").is_file()):
        spec = load_job(ROOT / "tests" / "golden" / case / "job.yaml")
        job = render.mpijob(spec)
        for level in LEVELS:  # the MPIJob itself: CRD schema, CEL rules, server-side field validation
            j = json.loads(json.dumps(job))
            j["metadata"]["namespace"] = f"psa-{level}"
            r = kubectl("create", "--dry-run=server", "--validate=strict", "-o", "name", "-f", "-", stdin=json.dumps(j))
            if r.returncode or r.stderr.strip():
                print(f"{case} MPIJob in psa-{level}: rc={r.returncode} {r.stderr.strip()}")
        for role, pods in operator.pods(job).items():
            for pod in pods:
                ours = podsecurity.level(pod)
                prerequisites(pod)
                for level in LEVELS:
                    p = {"apiVersion": "v1", "kind": "Pod", **json.loads(json.dumps(pod))}
                    p["metadata"]["namespace"] = f"psa-{level}"
                    p["metadata"].pop("generateName", None)
                    r = kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", stdin=json.dumps(p))
                    real = r.returncode == 0
                    expect = LEVELS.index(ours) >= LEVELS.index(level)
                    mark = "ok" if real == expect else "DISAGREE"
                    disagreements += real != expect
                    why = "" if real else " | " + r.stderr.strip().replace("\n", " ")[:400]
                    print(f"{mark:8} {case:14} {role:8} {pod['metadata']['name'][:28]:28} hvdk8s={ours:10} "
                          f"{level:10} admitted={real}{why}")
    print(f"{disagreements} disagreement(s)")
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
