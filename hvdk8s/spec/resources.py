"""`resources`: what the job asks of a cluster (GPUs, worker pods and their CPU, memory and /dev/shm, RDMA,
the ranks' tuning profile), checked against what the MPI operator, Horovod and the nodes accept."""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from hvdk8s import tuning
from hvdk8s.core import k8snames
from hvdk8s.core.quantity import Quantity, parse_quantity
from hvdk8s.core.strict import StrictModel
from hvdk8s.spec.values import INT32_MAX, k8s_valid

Tuning = Literal[tuning.PROFILES]

_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class RDMASpec(StrictModel):
    """RDMA / RoCE networking for NCCL between nodes."""

    enabled: bool = False
    resource: str = Field(default="rdma/rdma_shared_device_a",
                          description="device-plugin resource each worker requests (SR-IOV: e.g. nvidia.com/hostdev)")
    count: int = Field(default=1, ge=1, le=2**31 - 1)
    networks: Optional[str] = Field(default=None, description="Multus k8s.v1.cni.cncf.io/networks annotation")
    hca: Optional[str] = Field(default=None, description="NCCL_IB_HCA, e.g. mlx5")
    gid_index: int = Field(default=3, ge=0, description="NCCL_IB_GID_INDEX (3: RoCE v2 on most NICs)")
    gdr_level: Optional[str] = Field(default=None, description="NCCL_NET_GDR_LEVEL, e.g. PHB")
    socket_ifname: str = Field(default="eth0", description="NCCL_SOCKET_IFNAME: the pod interface for sockets")

    @field_validator("resource")
    @classmethod
    def _resource_name(cls, v: str) -> str:
        if not _RESOURCE.match(v) or k8snames.qualified_name(v):
            raise ValueError(f"{v!r} is not an extended resource name (domain/name, e.g. rdma/rdma_shared_device_a)")
        return v

    @field_validator("socket_ifname")
    @classmethod
    def _interface(cls, v: str) -> str:
        return k8s_valid(k8snames.interface_name, v)

    @field_validator("networks")
    @classmethod
    def _networks(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            k8snames.multus_interfaces(v)
        return v

    @model_validator(mode="after")
    def _socket_interface_exists(self) -> "RDMASpec":
        if self.socket_ifname not in self.pod_interfaces:
            raise ValueError(f"socket_ifname {self.socket_ifname!r} is not an interface of the worker pods, which "
                             f"have {', '.join(self.pod_interfaces)} (eth0 is the pod network; net1... come from "
                             "Multus `networks`, attached with RDMA on)")
        return self

    @property
    def pod_interfaces(self) -> list[str]:
        """Interfaces of a worker pod (no hostNetwork): the pod network's eth0, then each Multus network's."""
        return ["eth0", *(k8snames.multus_interfaces(self.networks) if self.enabled and self.networks else [])]


SHM_DEFAULT_MAX = 8 * 2**30  # a worker pod's /dev/shm by default: half its memory, at most this
# `gpus` counts the whole job; these are each worker pod's (messages and `validate --print` say so).
PER_WORKER_POD = ("cpu", "memory", "shm_size")


def _as_quantity(amount: Decimal) -> str:
    """Bytes as the shortest exact quantity: 8Gi, 1536Mi, 1000 (whole bytes, rounded down)."""
    whole = int(amount)
    for suffix, power in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if whole and whole % 2**power == 0:
            return f"{whole >> power}{suffix}"
    return str(whole)


def _default_shm_size(fields: dict) -> str:
    """Half the worker pod's memory, at most 8Gi: /dev/shm is memory-backed and counts against the limit.
    (Called only when the fields before it are valid.)"""
    return _as_quantity(min(parse_quantity(fields["memory"]) / 2, Decimal(SHM_DEFAULT_MAX)))


class ResourcesSpec(StrictModel):
    """What the job asks of a cluster. `gpus` is the whole job's; cpu, memory and shm_size are each worker pod's
    (a GPU job has one worker pod per node, holding min(gpus, gpus_per_node) GPUs)."""

    gpus: int = Field(default=0, ge=0, description="GPUs of the whole job, over all its worker pods (0: a CPU job)")
    gpus_per_node: int = Field(default=8, ge=1, le=INT32_MAX,
                               description="GPUs on each node; each worker pod takes min(gpus, gpus_per_node) of "
                                           "them (gpus: 2 on 8-GPU nodes: one worker pod with 2 GPUs)")
    gpu_product: Optional[str] = Field(default=None, description="nodeSelector on nvidia.com/gpu.product")
    workers: Optional[int] = Field(default=None, ge=1, le=INT32_MAX,
                                   description="worker pods; derived from gpus for GPU jobs, default 1 for CPU jobs")
    ranks_per_worker: int = Field(default=1, ge=1, le=INT32_MAX, description="ranks in each worker pod of a CPU job")
    cpu: Quantity = Field(default="4", description="CPU of each worker pod, not the job's total (Kubernetes "
                                                   "quantity)")
    memory: Quantity = Field(default="16Gi", description="memory limit of each worker pod, not the job's total "
                                                         "(Kubernetes quantity); shm_size counts against it")
    shm_size: Quantity = Field(default_factory=_default_shm_size,
                               description="/dev/shm of each worker pod (NCCL and loaders outgrow 64Mi): "
                                           "memory-backed, so at most `memory`; default half of memory, at most "
                                           "8Gi")
    rdma: RDMASpec = Field(default_factory=RDMASpec)
    hierarchical_allreduce: bool = Field(
        default=False, description="Horovod's hierarchical allreduce (NCCL in each node, MPI over TCP between "
                                   "nodes): only for multi-node GPU jobs without RDMA, where you measured it helps")
    tuning: Tuning = Field(
        default="auto", description="the ranks' tuning profile (hvdk8s/tuning.py): shared-cpu (Open MPI yields when "
                                    "idle, the allocators' settings, the sleepy negotiation, a single rank's 20 ms cycle), "
                                    "none, or auto: shared-cpu for CPU jobs and local launches without a GPU, none "
                                    "for GPU jobs")

    @field_validator("gpu_product")
    @classmethod
    def _label_value(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else k8s_valid(k8snames.label_value, v)

    @model_validator(mode="after")
    def _fits_32_bits(self) -> "ResourcesSpec":
        workers = self.gpus // min(self.gpus, self.gpus_per_node) if self.gpus else (self.workers or 1)
        slots = min(self.gpus, self.gpus_per_node) if self.gpus else self.ranks_per_worker
        if max(workers, slots, workers * slots) > INT32_MAX:
            raise ValueError(f"{workers} workers x {slots} ranks is beyond what the MPI operator and Horovod count "
                             f"(at most {INT32_MAX} workers, ranks per worker and ranks)")
        return self

    @field_validator("shm_size")
    @classmethod
    def _shm_within_memory(cls, v: str, info: ValidationInfo) -> str:
        memory = info.data.get("memory")  # validated before shm_size; absent when itself invalid
        if memory is not None and parse_quantity(v) > parse_quantity(memory):
            raise ValueError(f"resources.shm_size ({v}) is more than resources.memory ({memory}), both per worker "
                             "pod: /dev/shm is memory-backed and counts against the pod's memory limit; lower "
                             "shm_size or raise memory")
        return v

    @model_validator(mode="after")
    def _hierarchical_where_it_can_help(self) -> "ResourcesSpec":
        if not self.hierarchical_allreduce:
            return self
        if not self.gpus or self.gpus <= self.gpus_per_node:
            raise ValueError("hierarchical_allreduce is for GPU jobs on more than one node (gpus > gpus_per_node)")
        if self.rdma.enabled:
            raise ValueError("hierarchical_allreduce with rdma: Horovod 0.28.1 would do the cross-node step as a "
                             "host-memory MPI allreduce over TCP instead of NCCL over RDMA; leave it off")
        return self

    @field_validator("rdma", mode="before")
    @classmethod
    def _rdma_flag(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _whole_nodes(self) -> "ResourcesSpec":
        if self.gpus:
            per_node = min(self.gpus, self.gpus_per_node)
            if self.gpus % per_node:
                raise ValueError(f"gpus ({self.gpus}) do not fill whole nodes of gpus_per_node "
                                 f"({self.gpus_per_node}); use a multiple of {self.gpus_per_node}")
            if self.workers is not None and self.workers != self.gpus // per_node:
                raise ValueError(f"workers ({self.workers}) disagrees with gpus / gpus_per_node "
                                 f"({self.gpus // per_node}); leave workers out for GPU jobs")
        return self
