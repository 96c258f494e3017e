"""Inter-node networking of a job: RDMA/RoCE resources and NCCL settings, or plain TCP sockets, and the
interfaces OpenMPI and NCCL use.

Pods run without hostNetwork, so each has the pod network's `eth0` (where the job's DNS names point and
where the launcher is), plus `net1`... for Multus networks. OpenMPI's runtime (orted back to mpirun) and
its TCP transport are pinned to eth0: left alone they try every interface and can pick a Multus one that
the launcher, which has no such network, cannot reach. NCCL's sockets (bootstrap, and data without RDMA)
use `rdma.socket_ifname`, eth0 unless a Multus network attached to every worker is named.
"""
from __future__ import annotations

from hvdk8s.entrypoint import PYTHON_IN_IMAGE

from .topology import Topology

MPI_INTERFACE = "eth0"


def nccl_env(resources, topology: Topology) -> dict[str, str]:
    """NCCL and Horovod variables the ranks need (none for CPU jobs, which do not use NCCL)."""
    if not topology.gpus_per_worker:
        return {}
    rdma = resources.rdma
    env = {"NCCL_SOCKET_IFNAME": rdma.socket_ifname}
    if resources.hierarchical_allreduce:
        # Off by default. In Horovod 0.28.1 (NCCLHierarchicalAllreduce) the cross-node step is an MPI_Allreduce
        # of a host-memory copy over OpenMPI's TCP transport, so it only ever competes with NCCL's own sockets
        # (TCP clusters) and loses to NCCL over RDMA (refused with rdma on). Horovod's docs leave it to tuning
        # (its autotuner tries it), so hvdk8s sets it only where the job file says it was measured to help.
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    if not rdma.enabled:
        env["NCCL_IB_DISABLE"] = "1"
        return env
    # NCCL_NET=IB: with RDMA asked for, a rank fails if NCCL cannot use it, never silently runs on TCP sockets.
    env.update({"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB", "NCCL_IB_GID_INDEX": str(rdma.gid_index)})
    if rdma.hca:
        env["NCCL_IB_HCA"] = rdma.hca
    if rdma.gdr_level:
        env["NCCL_NET_GDR_LEVEL"] = rdma.gdr_level
    return env


def mpirun_interface_args() -> list[str]:
    """OpenMPI's runtime and TCP transport on the pod network only (see the module's note)."""
    return ["-mca", "oob_tcp_if_include", MPI_INTERFACE, "-mca", "btl_tcp_if_include", MPI_INTERFACE]


def rank_prefix(rdma) -> list[str]:
    """What each rank's command is wrapped in: with RDMA, the locked-memory check (hvdk8s.launch.memlock)."""
    return [PYTHON_IN_IMAGE, "-m", "hvdk8s.launch.memlock", "--"] if rdma.enabled else []


def worker_resources(rdma) -> dict[str, str]:
    """Extended resources each worker requests for RDMA (the device plugin's resource)."""
    return {rdma.resource: str(rdma.count)} if rdma.enabled else {}


def worker_annotations(rdma) -> dict[str, str]:
    """Pod annotations: the Multus secondary network carrying RDMA traffic, when one is named."""
    return {"k8s.v1.cni.cncf.io/networks": rdma.networks} if rdma.enabled and rdma.networks else {}
