"""Pointed at another cluster (HVDK8S_TEST_KUBECONFIG), the tests say whether a real mpi-operator runs
there (`cluster.operator`). How they tell, checked on the project's own cluster (whose operator runs as a
process, not a Deployment): a Deployment named mpi-operator (as mpi-operator's manifests install it), or
HVDK8S_TEST_OPERATOR=1.
"""
from __future__ import annotations

from cluster_helpers import operator_in


def test_a_real_mpi_operator_is_told_from_its_deployment_or_the_variable(own_cluster, namespace, monkeypatch):
    monkeypatch.delenv("HVDK8S_TEST_OPERATOR", raising=False)
    assert operator_in(own_cluster) is None
    # No controller makes its pods here: the Deployment object is all there is, and all the check reads.
    own_cluster.kubectl("create", "deployment", "mpi-operator", "-n", namespace, "--image=mpioperator/mpi-operator")
    try:
        assert operator_in(own_cluster) == f"deployment mpi-operator in namespace {namespace}"
    finally:
        own_cluster.kubectl("delete", "deployment", "mpi-operator", "-n", namespace)
    assert operator_in(own_cluster) is None
    monkeypatch.setenv("HVDK8S_TEST_OPERATOR", "1")
    assert operator_in(own_cluster) == "HVDK8S_TEST_OPERATOR=1"
