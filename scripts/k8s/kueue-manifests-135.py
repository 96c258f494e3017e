"""Kueue's CRDs and webhook configurations, from its downloaded module, rewritten for a Kueue that runs as a
process on 127.0.0.1 beside the test cluster (issue 28): every webhook and CRD conversion reached by URL
(https://127.0.0.1:PORT/<path>) with the test CA as caBundle, instead of through the in-cluster Service
`webhook-service` that kustomize would wire up.

    python3 kueue-manifests-135.py MODULE_DIR https://127.0.0.1:PORT CA_FILE FRAMEWORKS > manifests.yaml

MODULE_DIR is sigs.k8s.io/kueue@vX in the Go module cache; FRAMEWORKS the integrations Kueue is configured
with (e.g. batch/job,kubeflow.org/mpijob). Webhooks of other integrations (pods, deployments, Ray, ...) are
left out: Kueue registers no handler for them, and with failurePolicy Fail they would block those objects
cluster-wide. The CRDs that get a conversion webhook are the ones config/components/crd/kustomization.yaml
patches (its `patches/webhook_in_*.yaml` lines that are not commented out).
"""
from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import yaml

# libyaml's loader and dumper where PyYAML has them: the pure-Python ones took 5.7 CPU-s to read and write
# Kueue's CRDs (1.9 MB out) at every cluster start, these 0.5.
LOADER, DUMPER = getattr(yaml, "CSafeLoader", yaml.SafeLoader), getattr(yaml, "CSafeDumper", yaml.SafeDumper)
CORE = "kueue-x-k8s-io"  # webhook paths of Kueue's own types: /mutate-kueue-x-k8s-io-v1beta2-workload


def framework_path(framework: str) -> str:
    """batch/job -> batch-v1-job ... matched loosely: the group with dots as dashes, and the kind."""
    group, kind = framework.split("/")
    return f"{group.replace('.', '-')}-v", kind.lower()


def main(argv: list[str]) -> int:
    module, base, ca_file, frameworks = Path(argv[0]), argv[1].rstrip("/"), Path(argv[2]), argv[3].split(",")
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    crd_dir = module / "config" / "components" / "crd"
    kust = (crd_dir / "kustomization.yaml").read_text()
    converted = set()
    for patch in re.findall(r"^- path: (patches/webhook_in_\S+\.yaml)$", kust, re.M):
        doc = yaml.load((crd_dir / patch).read_text(), Loader=LOADER)
        converted.add(doc["metadata"]["name"])
    resources = re.findall(r"^- (bases/\S+\.yaml)$", kust, re.M)
    out = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}]
    for res in resources:
        crd = yaml.load((crd_dir / res).read_text(), Loader=LOADER)
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"{base}/convert", "caBundle": ca}, "conversionReviewVersions": ["v1"]}}
        out.append(crd)
    wanted = [framework_path(f) for f in frameworks]
    webhooks = (module / "config" / "components" / "webhook" / "manifests.yaml").read_text()
    for conf in yaml.load_all(webhooks, Loader=LOADER):
        if not conf:
            continue
        kept = []
        for hook in conf.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if CORE in path or any(g in path and path.endswith("-" + k) for g, k in wanted):
                hook["clientConfig"] = {"url": base + path, "caBundle": ca}
                kept.append(hook)
        conf["webhooks"] = kept
        conf["metadata"] = {"name": "kueue-" + conf["metadata"]["name"]}
        out.append(conf)
    yaml.dump_all(out, sys.stdout, Dumper=DUMPER, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
