"""Which cluster, user and namespace the cluster verbs use, read from the kubeconfig as kubectl reads it:
the namespace of the (current or --context) context when neither the job file nor -n names one, and
KUBECONFIG as a ':'-joined list of files merged into one. Against the real API server.
"""
from __future__ import annotations

import os

import yaml

from cluster_helpers import job_objects, unique


def _config(cluster) -> dict:
    return yaml.safe_load(cluster.kubeconfig.read_text())


def _current(config: dict) -> dict:
    return next(c for c in config["contexts"] if c["name"] == config["current-context"])


def _launched_in(cluster, namespace, name) -> None:
    job, cm = job_objects(cluster, namespace, name)
    assert job is not None and cm is not None
    assert yaml.safe_load(cm["data"]["job.yaml"])["kubernetes"]["namespace"] == namespace  # what the ranks read


def test_the_namespace_comes_from_the_current_context(cluster, job_file, namespace, tmp_path):
    config = _config(cluster)
    ours = {"name": "the-tests-namespace", "context": {**_current(config)["context"], "namespace": namespace}}
    config["contexts"].append(ours)
    config["current-context"] = ours["name"]
    copy = tmp_path / "kubeconfig"
    copy.write_text(yaml.safe_dump(config))
    name = unique("ctx")
    run = cluster.cli("launch", job_file({"name": name}), kubeconfig=copy)  # no namespace in the file, no -n
    assert run.returncode == 0, run.stderr
    assert f"in namespace {namespace}, context the-tests-namespace" in run.stdout
    _launched_in(cluster, namespace, name)
    shown = cluster.cli("status", name, kubeconfig=copy)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"mpijob {name} (namespace {namespace})")


def test_contexts_split_over_two_kubeconfig_files_are_merged(cluster, job_file, namespace, tmp_path):
    """KUBECONFIG=a:b, where a (the cluster's own file) holds the cluster and the user, b only a context
    naming them: `--context` picks b's context with a's credentials."""
    current = _current(_config(cluster))
    split = tmp_path / "contexts"
    split.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "contexts": [
        {"name": "split", "context": {**current["context"], "namespace": namespace}}]}))
    both = os.pathsep.join([str(cluster.kubeconfig), str(split)])
    name = unique("split")
    run = cluster.cli("launch", job_file({"name": name}), "--context", "split", kubeconfig=both)
    assert run.returncode == 0, run.stderr
    assert f"in namespace {namespace}, context split" in run.stdout
    _launched_in(cluster, namespace, name)
    shown = cluster.cli("status", name, "--context", "split", kubeconfig=both)
    assert shown.returncode == 0 and f"(namespace {namespace})" in shown.stdout, shown.stderr
    # Without --context, a's current context (another namespace) is used, where there is no such job.
    elsewhere = current["context"].get("namespace") or "default"
    other = cluster.cli("status", name, kubeconfig=both)
    assert other.returncode == 2 and f"no mpijob {name} in namespace {elsewhere}" in other.stderr
