"""An MPIJob's pod templates as the Pods the operator makes of them: against the Kubernetes Pod schema that
the optional kubernetes-validate package bundles (`hvdk8s[validate]`), the API server's Pod rules no
schema encodes (`podrules`), and hvdk8s's policy on privileged containers."""
from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import json
from typing import Any

from ..problems import Problem, child, json_type, unsupported
from . import podrules
from .policies import privileged_containers
from .schema import field_schema, list_type_problems, prune_nulls

# Newest Kubernetes whose Pod schema is used; an older kubernetes-validate falls back to its newest one.
K8S_VERSION = "1.37"


def pod_schema_available() -> bool:
    """Whether Pod specs can be checked (the optional kubernetes-validate package, `hvdk8s[validate]`)."""
    return importlib.util.find_spec("kubernetes_validate") is not None


def validate_pod_template(template: Any, path: str, k8s_version: str = K8S_VERSION, *, pod_schema: bool = True,
                          operator_volumes: dict[str, str] | None = None, policies: bool = True) -> list[Problem]:
    """TEMPLATE (a PodTemplateSpec at PATH) as the v1 Pod the operator makes of it: the Pod schema of Kubernetes
    K8S_VERSION (with POD_SCHEMA and kubernetes-validate installed), the API server's Pod rules, and (with
    POLICIES) what hvdk8s refuses. OPERATOR_VOLUMES: {name: mount path} of the volumes the operator adds."""
    if not isinstance(template, dict):
        return [Problem(path, f"expected object, got {json_type(template)}")]
    template, problems = prune_nulls(template, path)
    if pod_schema:
        pod = {**template, "apiVersion": "v1", "kind": "Pod"}  # same keys below the root, so paths carry over
        problems += [problem for error in _pod_validator(k8s_version).iter_errors(pod)
                     for problem in _pod_schema_problems(error, path)]
        pod_root, defs = _pod_definitions(k8s_version)
        problems += _list_types_in_pod(template, pod_root, defs, path)
    problems += podrules.template_problems(template, path, operator_volumes)
    if policies:
        problems += privileged_containers(template, path)
    return problems


def _k8s_schema_dir(k8s_version: str) -> Any:  # an importlib.resources Traversable
    """kubernetes-validate's strict schemas for the newest bundled Kubernetes not newer than K8S_VERSION."""
    try:
        root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    except ModuleNotFoundError:
        raise RuntimeError("validating pod templates needs the kubernetes-validate package") from None

    def minor(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.lstrip("v").split("-")[0].split(".")[:2])

    bundled = sorted(((minor(d.name), d) for d in root.iterdir() if d.name.endswith("-local-strict")),
                     key=lambda pair: pair[0])
    usable = [d for version, d in bundled if version <= minor(k8s_version)]
    if not usable:
        raise ValueError(f"kubernetes-validate has no schemas for Kubernetes {k8s_version} or older "
                         f"(oldest bundled: {bundled[0][1].name})")
    return usable[-1]


@functools.lru_cache(maxsize=4)
def _bundled_documents(k8s_version: str) -> tuple[dict, dict]:
    """(pod-v1.json, _definitions.json) as kubernetes-validate bundles them, read once."""
    schema_dir = _k8s_schema_dir(k8s_version)
    pod, definitions = (json.loads((schema_dir / name).read_text(encoding="utf-8"))
                        for name in ("pod-v1.json", "_definitions.json"))
    return pod, definitions


@functools.lru_cache(maxsize=4)
def _pod_validator(k8s_version: str) -> Any:  # a jsonschema validator
    import jsonschema  # kubernetes-validate's own dependencies
    from referencing import Registry, Resource

    pod, definitions = _bundled_documents(k8s_version)
    registry = Registry().with_resources((doc["$id"], Resource.from_contents(doc)) for doc in (pod, definitions))
    return jsonschema.Draft202012Validator(pod, registry=registry)


def _pod_definitions(k8s_version: str) -> tuple[dict, dict]:
    """(the Pod schema, its $defs)."""
    pod, definitions = _bundled_documents(k8s_version)
    return pod, definitions["$defs"]


def _pod_schema_problems(error: Any, path: str) -> list[Problem]:
    """One jsonschema error as Problems, in the same words validate_schema uses."""
    where = path
    for key in error.absolute_path:
        where = child(where, key)
    if error.validator == "additionalProperties":
        return [Problem(child(where, key), "unknown field")
                for key in error.instance if key not in error.schema.get("properties", {})]
    if error.validator == "required":
        return [Problem(child(where, key), "required field is missing")
                for key in error.validator_value if key not in error.instance]
    if error.validator == "type":
        kinds = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        expected = " or ".join(kind for kind in kinds if kind != "null")
        return [Problem(where, f"expected {expected}, got {json_type(error.instance)}")]
    if error.validator == "enum":
        return [Problem(where, unsupported(error.instance, error.validator_value))]
    return [Problem(where, error.message)]


def _resolved(schema: dict, defs: dict) -> dict:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _list_types_in_pod(obj: Any, schema: dict, defs: dict, path: str) -> list[Problem]:
    """The Pod schema's x-kubernetes-list-type rules (unique container names, ports, mounts...) over OBJ."""
    schema = _resolved(schema, defs)
    problems: list[Problem] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            sub = field_schema(schema, key)
            if sub is not None:
                problems += _list_types_in_pod(value, sub, defs, child(path, key))
    elif isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, dict):
            problems += list_type_problems(obj, {**schema, "items": _resolved(items, defs)}, path)
            for i, item in enumerate(obj):
                problems += _list_types_in_pod(item, items, defs, child(path, i))
    return problems
