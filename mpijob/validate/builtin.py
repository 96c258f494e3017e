"""hvdk8s's own description of the MPIJob v2beta1 fields, in the CRD's schema form, for when no CRD is at
hand. Types only: the operator's rules (`operator_rules`) carry the allowed values, so that both routes
report those in the same words. Pod templates are left open here (the Pod schema and `podrules` check
them) but for their quantities, typed as the CRD types resource.Quantity: integer or string, never a
float, which the API server refuses although the Pod schema that kubernetes-validate bundles allows it."""
from __future__ import annotations

from typing import Iterable

from hvdk8s.core.quantity import PATTERN as QUANTITY_PATTERN

from ..api import MPI_IMPLEMENTATIONS

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT32 = {"type": "integer", "format": "int32"}
_INT64 = {"type": "integer", "format": "int64"}
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}  # checked elsewhere
_QUANTITY = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}


def _obj(required: Iterable[str] = (), **properties: dict) -> dict:
    return {"type": "object", "properties": properties, **({"required": list(required)} if required else {})}


def _map(values: dict) -> dict:
    return {"type": "object", "additionalProperties": values}


def _within(**properties: dict) -> dict:
    """A part of a pod template on the way to its quantities: only those are checked here, so its own type
    and its other fields are left to the Pod schema (untyped, and open)."""
    return {"x-kubernetes-preserve-unknown-fields": True, "properties": properties}


def _list_of(item: dict) -> dict:
    return {"items": item}


_QUANTITIES = {"additionalProperties": _QUANTITY}  # a ResourceList, untyped like the parts around it
_RESOURCES = _within(limits=_QUANTITIES, requests=_QUANTITIES)
_RESOURCE_FIELD_REF = _within(resourceFieldRef=_within(divisor=_QUANTITY))  # the downward API's
_CONTAINER = _within(resources=_RESOURCES, env=_list_of(_within(valueFrom=_RESOURCE_FIELD_REF)))
_DOWNWARD_API = _within(items=_list_of(_RESOURCE_FIELD_REF))
_VOLUME = _within(
    emptyDir=_within(sizeLimit=_QUANTITY),
    downwardAPI=_DOWNWARD_API,
    projected=_within(sources=_list_of(_within(downwardAPI=_DOWNWARD_API))),
    ephemeral=_within(volumeClaimTemplate=_within(spec=_within(resources=_RESOURCES))),
)
_POD_SPEC = {**_OPEN, **_within(
    containers=_list_of(_CONTAINER), initContainers=_list_of(_CONTAINER), ephemeralContainers=_list_of(_CONTAINER),
    resources=_RESOURCES,  # pod-level resources
    overhead=_QUANTITIES,
    volumes=_list_of(_VOLUME),
)}

BUILTIN_SCHEMA = _obj(
    apiVersion=_STR,
    kind=_STR,
    metadata={"type": "object"},
    spec=_obj(
        required=["mpiReplicaSpecs"],
        slotsPerWorker=_INT32,
        runPolicy=_obj(
            cleanPodPolicy=_STR,
            ttlSecondsAfterFinished=_INT32,
            activeDeadlineSeconds=_INT64,
            backoffLimit=_INT32,
            schedulingPolicy=_obj(
                minAvailable=_INT32,
                queue=_STR,
                minResources=_map(_QUANTITY),
                priorityClass=_STR,
                scheduleTimeoutSeconds=_INT32,
            ),
            suspend=_BOOL,
            managedBy=_STR,
        ),
        mpiReplicaSpecs=_map(_obj(replicas=_INT32, restartPolicy=_STR, template=_obj(metadata=_OPEN, spec=_POD_SPEC))),
        sshAuthMountPath=_STR,
        launcherCreationPolicy=_STR,
        mpiImplementation={"type": "string", "enum": list(MPI_IMPLEMENTATIONS)},
        runLauncherAsWorker=_BOOL,
    ),
    status=_OPEN,  # written by the operator; present in `kubectl get -o yaml` output
)
