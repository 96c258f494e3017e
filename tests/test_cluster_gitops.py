"""The GitOps route against a real API server: `hvdk8s render -d DIR`, applied by kubectl itself
(`kubectl apply -k DIR`, as a GitOps controller applies a folder), then followed and removed with the
same verbs as a job `hvdk8s launch` made. The real mpi-operator runs the applied job; on kwok's nodes
the test ends the launcher's container (`end_launcher`).
"""
from __future__ import annotations

from cluster_helpers import end_launcher, job_objects, unique


def test_a_rendered_folder_applied_with_kubectl_is_followed_and_deleted(own_cluster, job_file, namespace, tmp_path):
    cluster = own_cluster
    name, folder = unique("gitops"), tmp_path / "deploy"
    path = job_file({"name": name, "kubernetes": {"namespace": namespace}})
    rendered = cluster.cli("render", path, "-d", folder)
    assert rendered.returncode == 0, rendered.stderr
    applied = cluster.kubectl("apply", "-k", folder)
    assert f"configmap/{name}-job created" in applied.stdout and f"mpijob.kubeflow.org/{name} created" in applied.stdout
    _, cm = job_objects(cluster, namespace, name)
    # As rendered: no uid to own it by, so only its labels say whose it is (what `delete` goes by then).
    assert "ownerReferences" not in cm["metadata"]
    assert cm["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "hvdk8s", "hvdk8s.io/job": name}

    end_launcher(cluster, namespace, name, 0)
    waited = cluster.cli("wait", name, "-n", namespace, "--timeout", "300s")
    assert waited.returncode == 0, waited.stderr
    assert f"mpijob/{name}: Succeeded" in waited.stderr
    shown = cluster.cli("status", name, "-n", namespace)
    assert shown.returncode == 0 and "phase:      Succeeded" in shown.stdout, shown.stderr

    # The job is there, whoever applied it: a direct launch of the same job is refused.
    again = cluster.cli("launch", path)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert f"mpijob {name} already exists in namespace {namespace} (Succeeded" in again.stderr

    deleted = cluster.cli("delete", name, "-n", namespace)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.splitlines() == [f"deleted mpijob/{name}", f"deleted configmap/{name}-job"]
    assert job_objects(cluster, namespace, name) == (None, None)


def test_delete_leaves_a_configmap_of_that_name_that_is_not_the_jobs(cluster, job_file, namespace, tmp_path):
    """The labels decide: a ConfigMap `NAME-job` that hvdk8s did not make stays."""
    name, folder = unique("gitops"), tmp_path / "deploy"
    assert cluster.cli("render", job_file({"name": name, "kubernetes": {"namespace": namespace}}), "-d",
                       folder).returncode == 0
    cluster.kubectl("apply", "-f", folder / "mpijob.yaml")
    cluster.kubectl("create", "configmap", f"{name}-job", "-n", namespace, "--from-literal=owner=someone-else")
    deleted = cluster.cli("delete", name, "-n", namespace)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.splitlines() == [f"deleted mpijob/{name}"]
    job, cm = job_objects(cluster, namespace, name)
    assert job is None and cm["data"] == {"owner": "someone-else"}


def test_validate_checks_rendered_yaml_against_the_crd_the_cluster_serves(own_cluster, job_file, tmp_path):
    """`hvdk8s validate --crd-from-cluster` (a pipeline's gate before it applies a folder) reads the MPIJob CRD
    through the Kubernetes client, with the kubeconfig's current context: the rendered MPIJob passes, a
    changed one is refused naming its field, and a user who may not read CRDs is told so in one line (exit 2)."""
    import yaml

    from cluster_helpers import NOBODY

    folder = tmp_path / "deploy"
    assert own_cluster.cli("render", job_file({"name": unique("gate")}), "-d", folder).returncode == 0
    passed = own_cluster.cli("validate", "--crd-from-cluster", folder / "mpijob.yaml")
    assert passed.returncode == 0, passed.stderr
    assert "valid MPIJob (checked against the cluster's CRD" in passed.stdout
    job = yaml.safe_load((folder / "mpijob.yaml").read_text())
    job["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(job))
    refused = own_cluster.cli("validate", "--crd-from-cluster", tmp_path / "changed.yaml")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "spec.runPolicy.cleanPodPolicy" in refused.stderr and "Sometimes" in refused.stderr
    config = yaml.safe_load(own_cluster.kubeconfig.read_text())
    config["current-context"] = NOBODY
    (tmp_path / "nobody.kubeconfig").write_text(yaml.safe_dump(config))
    forbidden = own_cluster.cli("validate", "--crd-from-cluster", folder / "mpijob.yaml",
                                kubeconfig=tmp_path / "nobody.kubeconfig")
    assert forbidden.returncode == 2 and "Traceback" not in forbidden.stderr, forbidden.stderr
    assert "may not read the mpijobs.kubeflow.org CRD of the cluster at https://127.0.0.1:" in forbidden.stderr
