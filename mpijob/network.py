"""Inter-node networking of a job: RDMA/RoCE resources and NCCL settings, or plain TCP sockets."""
from __future__ import annotations

from .topology import Topology


def nccl_env(rdma, topology: Topology) -> dict[str, str]:
    """NCCL variables the ranks need (none for CPU jobs, which do not use NCCL)."""
    if not topology.gpus_per_worker:
        return {}
    env = {"NCCL_SOCKET_IFNAME": rdma.socket_ifname}
    if not rdma.enabled:
        env["NCCL_IB_DISABLE"] = "1"
        return env
    env.update({"NCCL_IB_DISABLE": "0", "NCCL_IB_GID_INDEX": str(rdma.gid_index)})
    if rdma.hca:
        env["NCCL_IB_HCA"] = rdma.hca
    if rdma.gdr_level:
        env["NCCL_NET_GDR_LEVEL"] = rdma.gdr_level
    return env


def worker_resources(rdma) -> dict[str, str]:
    """Extended resources each worker requests for RDMA (the device plugin's resource)."""
    return {rdma.resource: str(rdma.count)} if rdma.enabled else {}


def worker_annotations(rdma) -> dict[str, str]:
    """Pod annotations: the Multus secondary network carrying RDMA traffic, when one is named."""
    return {"k8s.v1.cni.cncf.io/networks": rdma.networks} if rdma.enabled and rdma.networks else {}


def capabilities(rdma) -> list[str]:
    """IPC_LOCK lets NCCL pin (register) memory for RDMA; nothing else, and never privileged."""
    return ["IPC_LOCK"] if rdma.enabled else []
