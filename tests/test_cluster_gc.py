"""The ConfigMap `hvdk8s launch` makes is owned by its MPIJob, so that deleting the job by any means
deletes it: the cluster's garbage collector follows the ownerReference (kube-controller-manager's, on the
project's cluster as on any other).
"""
from __future__ import annotations

import time

from cluster_helpers import job_objects, unique

GC_BOUND_S = 60  # the collector acts within a second or two once it sees the owner gone


def test_deleting_the_mpijob_with_kubectl_deletes_its_configmap(cluster, job_file, namespace):
    name = unique("gc")
    launched = cluster.cli("launch", job_file({"name": name, "kubernetes": {"namespace": namespace}}))
    assert launched.returncode == 0, launched.stderr
    job, cm = job_objects(cluster, namespace, name)
    assert [ref["uid"] for ref in cm["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]

    cluster.kubectl("delete", "mpijob", name, "-n", namespace, "--wait=false")  # as a user would, not hvdk8s delete
    deadline = time.monotonic() + GC_BOUND_S
    while job_objects(cluster, namespace, name) != (None, None):
        assert time.monotonic() < deadline, f"configmap {name}-job outlived its MPIJob by {GC_BOUND_S}s"
        time.sleep(0.5)
