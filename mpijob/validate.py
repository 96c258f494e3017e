"""Client-side validation of Kubeflow MPIJobs (kubeflow.org/v2beta1).

The aim is to judge as the cluster does: accept what the API server and mpi-operator v0.8.2 accept, reject
what they reject, each with a field path. Layers, each reporting every problem as a `Problem(path, message)`:

* the fields: either an OpenAPI v3 structural schema (the `openAPIV3Schema` of the MPIJob CRD a cluster
  serves: `load_crd_schema` of a file, or of what `KubernetesLauncher.served_schema` reads) or hvdk8s's own compact description of the
  v2beta1 fields (`BUILTIN_SCHEMA`), applied as the API server applies a CRD's: nulls of non-nullable
  fields are pruned (or defaulted) first, null list items are errors, `x-kubernetes-list-type` map and
  set lists must not repeat a key. Unknown fields are errors: a 1.20-era API server drops them silently,
  and newer kubectl (strict field validation) refuses them;
* the object's metadata as the API server checks every object's (name or generateName, labels, annotations);
* the rules mpi-operator enforces in its controller (pkg/apis/kubeflow/validation), applied after its
  defaults (SetDefaults_MPIJob: a Launcher without replicas has 1, a Worker's default 0 is refused);
* the pod templates, as the Pods the operator makes of them: against the Kubernetes JSON schemas that
  kubernetes-validate bundles, and the API server's Pod rules no schema encodes (`podrules`);
* hvdk8s's own policies, marked `Problem.policy` and left out with `policies=False`: no privileged
  containers, no replica types or launcherCreationPolicy values the operator would silently ignore.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import re
from pathlib import Path
from typing import Any, Iterable, Union

from hvdk8s import k8snames, quantity, safeyaml

from . import layout, podrules
from .api import API_VERSION, CRD_NAME, GROUP, KIND, VERSION
from .problems import POLICY, Problem, child as _child, duplicates, repeated

# Newest Kubernetes whose Pod schema is used; an older kubernetes-validate falls back to its newest one.
K8S_VERSION = "1.37"

QUANTITY_PATTERN = quantity.PATTERN  # the one grammar, also as the built-in schema's pattern
_INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int subclass in Python
        return "boolean"
    for kind, name in ((int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unsupported(value: Any, allowed: Iterable[Any]) -> str:
    return f"unsupported value {value!r}; supported: {', '.join(map(str, allowed))}"


# ---------------------------------------------------------------------------------------------------
# Structural OpenAPI v3 schemas (the subset CRDs use)

def _type_ok(value: Any, kind: str) -> bool:
    if kind == "number":
        return _json_type(value) in ("integer", "number")
    return _json_type(value) == kind


def validate_schema(obj: Any, schema: dict, path: str = "") -> list[Problem]:
    """Every way OBJ breaks the structural schema SCHEMA; paths start at PATH."""
    if obj is None:
        return [] if schema.get("nullable") else [Problem(path, "must not be null")]
    problems: list[Problem] = []
    if schema.get("x-kubernetes-int-or-string"):
        if not (_is_int(obj) or isinstance(obj, str)):
            return [Problem(path, f"expected integer or string, got {_json_type(obj)}")]
    elif "type" in schema and not _type_ok(obj, schema["type"]):
        return [Problem(path, f"expected {schema['type']}, got {_json_type(obj)}")]
    if "anyOf" in schema and all(validate_schema(obj, branch, path) for branch in schema["anyOf"]):
        forms = ", ".join(branch.get("type", "schema") for branch in schema["anyOf"])
        problems.append(Problem(path, f"matches none of the allowed forms ({forms})"))
    if "enum" in schema and obj not in schema["enum"]:
        problems.append(Problem(path, _unsupported(obj, schema["enum"])))

    if isinstance(obj, dict):
        problems += _validate_object(obj, schema, path)
    elif isinstance(obj, list):
        if "items" in schema:
            for i, item in enumerate(obj):
                problems += validate_schema(item, schema["items"], _child(path, i))
        problems += _list_type_problems(obj, schema, path)
        if len(obj) < schema.get("minItems", 0):
            problems.append(Problem(path, f"must have at least {schema['minItems']} items"))
        if "maxItems" in schema and len(obj) > schema["maxItems"]:
            problems.append(Problem(path, f"must have at most {schema['maxItems']} items"))
    elif isinstance(obj, str):
        if "pattern" in schema and not re.search(schema["pattern"], obj):
            problems.append(Problem(path, f"{obj!r} does not match the pattern {schema['pattern']}"))
        if len(obj) < schema.get("minLength", 0):
            problems.append(Problem(path, f"must be at least {schema['minLength']} characters long"))
        if "maxLength" in schema and len(obj) > schema["maxLength"]:
            problems.append(Problem(path, f"must be at most {schema['maxLength']} characters long"))
    elif _json_type(obj) in ("integer", "number"):
        if "minimum" in schema and obj < schema["minimum"]:
            problems.append(Problem(path, f"must be >= {schema['minimum']}"))
        if "maximum" in schema and obj > schema["maximum"]:
            problems.append(Problem(path, f"must be <= {schema['maximum']}"))
        if schema.get("format") in _INT_RANGES:
            low, high = _INT_RANGES[schema["format"]]
            if not low <= obj <= high:
                problems.append(Problem(path, f"out of {schema['format']} range"))
    return problems


def _field_schema(schema: dict, key: str) -> dict | None:
    extra = schema.get("additionalProperties")
    return schema.get("properties", {}).get(key) or (extra if isinstance(extra, dict) else None)


def _pruned(value: Any, field_schema: dict | None) -> bool:
    """Whether the API server drops VALUE before validating: a null where the schema allows none (a default,
    if the field has one, takes its place)."""
    return value is None and field_schema is not None and not field_schema.get("nullable")


def _list_type_problems(items: list, schema: dict, path: str) -> list[Problem]:
    kind = schema.get("x-kubernetes-list-type")
    if kind == "set":
        return repeated(items, path)
    if kind == "map":
        item_properties = (schema.get("items") or {}).get("properties", {})
        defaults = {k: item_properties[k]["default"] for k in schema.get("x-kubernetes-list-map-keys", [])
                    if "default" in item_properties.get(k, {})}
        return duplicates(items, schema.get("x-kubernetes-list-map-keys", []), path, defaults)
    return []


def _validate_object(obj: dict, schema: dict, path: str) -> list[Problem]:
    properties = schema.get("properties", {})
    present = {k for k, v in obj.items() if not _pruned(v, _field_schema(schema, k))}
    problems = [Problem(_child(path, key), "required field is missing")
                for key in schema.get("required", ()) if key not in present and "default" not in properties.get(key, {})]
    extra = schema.get("additionalProperties", False)
    for key, value in obj.items():
        where = _child(path, key)
        if key not in present:
            continue
        if key == "metadata" and path == "" and "properties" not in properties.get(key, {}):
            # A CRD's root metadata is always ObjectMeta, which its schema leaves open (`type: object`).
            problems += _validate_object_meta(value, where)
        elif key in properties:
            problems += validate_schema(value, properties[key], where)
        elif isinstance(extra, dict):
            problems += validate_schema(value, extra, where)
        elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")):
            problems.append(Problem(where, "unknown field"))
    return problems


def _validate_object_meta(meta: Any, path: str) -> list[Problem]:
    """ObjectMeta as the API server checks it on every object (apimachinery ValidateObjectMeta)."""
    if not isinstance(meta, dict):
        return [Problem(path, f"expected object, got {_json_type(meta)}")]
    problems = []
    for key, check in (("name", k8snames.dns1123_subdomain), ("generateName", k8snames.dns1123_subdomain),
                       ("namespace", k8snames.dns1123_label)):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            problems.append(Problem(_child(path, key), f"expected string, got {_json_type(value)}"))
            continue
        if key == "generateName" and value.endswith("-"):
            value = value[:-1] + "a"  # a prefix may end in '-': the server appends 5 random characters
        problems += [Problem(_child(path, key), p) for p in check(value)]
    for key in ("labels", "annotations"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            problems.append(Problem(_child(path, key), f"expected object, got {_json_type(meta[key])}"))
    # A labels value that is not a map is reported above; its keys are checked only when it is one.
    problems += [Problem(_child(_child(path, "labels"), key), p) for key, p in k8snames.labels(_d(meta.get("labels")))]
    problems += podrules.annotation_problems(meta.get("annotations"), _child(path, "annotations"))
    return problems


# ---------------------------------------------------------------------------------------------------
# Where schemas come from

def load_crd_schema(source: Union[str, Path, dict], version: str = VERSION) -> dict:
    """The openAPIV3Schema of VERSION in the MPIJob CustomResourceDefinition SOURCE (a YAML/JSON file or a dict)."""
    if isinstance(source, dict):
        return _crd_version_schema(source, version, "the given CRD")
    return _crd_version_schema(_read_crd(source), version, str(source))


MAX_YAML_BYTES = 8 << 20  # a CRD file (mpi-operator's is about 0.7 MB) or a stream of many MPIJobs


def _read_crd(path: Union[str, Path]) -> Any:
    """The one document of the CRD file PATH, read within safeyaml's bounds; ValueError naming the file."""
    try:
        docs = safeyaml.read(path, max_bytes=MAX_YAML_BYTES)
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    except safeyaml.YAMLInputError as e:
        raise ValueError(f"{path}: {e}") from None
    if len(docs) > 1:
        raise ValueError(f"{path}: expected one YAML document (the MPIJob CRD), found {len(docs)}")
    return docs[0] if docs else None


def _crd_version_schema(crd: Any, version: str, origin: str) -> dict:
    spec = _d(_d(crd).get("spec"))
    if not (_d(crd).get("kind") == "CustomResourceDefinition" and spec.get("group") == GROUP
            and _d(spec.get("names")).get("kind") == KIND):
        raise ValueError(f"{origin}: not the MPIJob CustomResourceDefinition ({CRD_NAME})")
    versions = [_d(entry) for entry in spec.get("versions")] if isinstance(spec.get("versions"), list) else []
    for entry in versions:
        if entry.get("name") == version:
            schema = _d(entry.get("schema")).get("openAPIV3Schema")
            if not isinstance(schema, dict):
                raise ValueError(f"{origin}: version {version} has no openAPIV3Schema")
            return schema
    names = ", ".join(str(entry.get("name")) for entry in versions) or "none"
    raise ValueError(f"{origin}: the MPIJob CRD has no version {version} (it has: {names})")


# ---------------------------------------------------------------------------------------------------
# hvdk8s's own description of the v2beta1 fields, in the same schema form (types only; the controller
# rules below carry the allowed values, so both routes report those identically).

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT32 = {"type": "integer", "format": "int32"}
_INT64 = {"type": "integer", "format": "int64"}
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}  # checked elsewhere


def _obj(required: Iterable[str] = (), **properties: dict) -> dict:
    return {"type": "object", "properties": properties, **({"required": list(required)} if required else {})}


def _map(values: dict) -> dict:
    return {"type": "object", "additionalProperties": values}


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
                minResources=_map({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
                priorityClass=_STR,
                scheduleTimeoutSeconds=_INT32,
            ),
            suspend=_BOOL,
            managedBy=_STR,
        ),
        # Pod templates: only their two keys here; validate_pod_template checks the rest.
        mpiReplicaSpecs=_map(_obj(replicas=_INT32, restartPolicy=_STR, template=_obj(metadata=_OPEN, spec=_OPEN))),
        sshAuthMountPath=_STR,
        launcherCreationPolicy=_STR,
        mpiImplementation={"type": "string", "enum": ["OpenMPI", "Intel", "MPICH"]},
        runLauncherAsWorker=_BOOL,
    ),
    status=_OPEN,  # written by the operator; present in `kubectl get -o yaml` output
)


# ---------------------------------------------------------------------------------------------------
# Pod templates

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
def _pod_validator(k8s_version: str) -> Any:  # a jsonschema validator
    import jsonschema  # kubernetes-validate's own dependencies
    from referencing import Registry, Resource

    schema_dir = _k8s_schema_dir(k8s_version)
    pod, definitions = (json.loads((schema_dir / name).read_text(encoding="utf-8"))
                        for name in ("pod-v1.json", "_definitions.json"))
    registry = Registry().with_resources((doc["$id"], Resource.from_contents(doc)) for doc in (pod, definitions))
    return jsonschema.Draft202012Validator(pod, registry=registry)


def _pod_schema_problems(error: Any, path: str) -> list[Problem]:
    """One jsonschema error as Problems, in the same words validate_schema uses."""
    where = path
    for key in error.absolute_path:
        where = _child(where, key)
    if error.validator == "additionalProperties":
        return [Problem(_child(where, key), "unknown field")
                for key in error.instance if key not in error.schema.get("properties", {})]
    if error.validator == "required":
        return [Problem(_child(where, key), "required field is missing")
                for key in error.validator_value if key not in error.instance]
    if error.validator == "type":
        kinds = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        expected = " or ".join(kind for kind in kinds if kind != "null")
        return [Problem(where, f"expected {expected}, got {_json_type(error.instance)}")]
    if error.validator == "enum":
        return [Problem(where, _unsupported(error.instance, error.validator_value))]
    return [Problem(where, error.message)]


def pod_schema_available() -> bool:
    """Whether Pod specs can be checked (the optional kubernetes-validate package, `hvdk8s[validate]`)."""
    import importlib.util

    return importlib.util.find_spec("kubernetes_validate") is not None


@functools.lru_cache(maxsize=4)
def _pod_definitions(k8s_version: str) -> tuple[dict, dict]:
    """(the Pod schema, its $defs) as kubernetes-validate bundles them."""
    schema_dir = _k8s_schema_dir(k8s_version)
    pod, definitions = (json.loads((schema_dir / name).read_text(encoding="utf-8"))
                        for name in ("pod-v1.json", "_definitions.json"))
    return pod, definitions["$defs"]


def _list_types_in_pod(obj: Any, schema: dict, defs: dict, path: str) -> list[Problem]:
    """The Pod schema's x-kubernetes-list-type rules (unique container names, ports, mounts...) over OBJ."""
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    problems: list[Problem] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            sub = _field_schema(schema, key)
            if sub is not None:
                problems += _list_types_in_pod(value, sub, defs, _child(path, key))
    elif isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, dict):
            resolved = items
            while "$ref" in resolved:
                resolved = defs[resolved["$ref"].rsplit("/", 1)[-1]]
            problems += _list_type_problems(obj, {**schema, "items": resolved}, path)
            for i, item in enumerate(obj):
                problems += _list_types_in_pod(item, items, defs, _child(path, i))
    return problems


def prune_nulls(obj: Any, path: str = "") -> tuple[Any, list[Problem]]:
    """OBJ as the API server stores it under the MPIJob CRD, which has no nullable field: null values of
    object fields dropped (a default, where the field has one, is valid in its place), and a Problem for
    each null list item, which the server refuses."""
    if isinstance(obj, dict):
        out, problems = {}, []
        for key, value in obj.items():
            if value is not None:
                out[key], found = prune_nulls(value, _child(path, key))
                problems += found
        return out, problems
    if isinstance(obj, list):
        items, problems = [], []
        for i, value in enumerate(obj):
            if value is None:
                problems.append(Problem(_child(path, i), "must not be null"))
            pruned, found = prune_nulls(value, _child(path, i))
            items.append(pruned)
            problems += found
        return items, problems
    return obj, []


def _privileged(template: dict, path: str) -> list[Problem]:
    spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    problems = []
    for field in podrules.CONTAINER_LISTS:
        for i, container in enumerate(spec.get(field) if isinstance(spec.get(field), list) else []):
            security = container.get("securityContext") if isinstance(container, dict) else None
            if isinstance(security, dict) and security.get("privileged") is True:
                problems.append(Problem(_child(_child(_child(path, "spec"), field), i) + ".securityContext.privileged",
                                        POLICY + "privileged containers are refused (the API server and the "
                                        "operator accept them; hvdk8s renders none)", policy=True))
    return problems


def validate_pod_template(template: Any, path: str, k8s_version: str = K8S_VERSION, *, pod_schema: bool = True,
                          operator_volumes: dict[str, str] | None = None, policies: bool = True) -> list[Problem]:
    """TEMPLATE (a PodTemplateSpec at PATH) as the v1 Pod the operator makes of it: the Pod schema of Kubernetes
    K8S_VERSION (with POD_SCHEMA and kubernetes-validate installed), the API server's Pod rules, and (with
    POLICIES) what hvdk8s refuses. OPERATOR_VOLUMES: {name: mount path} of the volumes the operator adds."""
    if not isinstance(template, dict):
        return [Problem(path, f"expected object, got {_json_type(template)}")]
    template, problems = prune_nulls(template, path)
    if pod_schema:
        pod = {**template, "apiVersion": "v1", "kind": "Pod"}  # same keys below the root, so paths carry over
        problems += [problem for error in _pod_validator(k8s_version).iter_errors(pod)
                     for problem in _pod_schema_problems(error, path)]
        pod_root, defs = _pod_definitions(k8s_version)
        problems += _list_types_in_pod(template, pod_root, defs, path)
    problems += podrules.template_problems(template, path, operator_volumes)
    if policies:
        problems += _privileged(template, path)
    return problems


# ---------------------------------------------------------------------------------------------------
# mpi-operator's controller rules, after its defaults (SetDefaults_MPIJob), as syncHandler applies them

REPLICA_TYPES = ("Launcher", "Worker")
RESTART_POLICIES = ("Never", "OnFailure")
CLEAN_POD_POLICIES = ("None", "Running", "All")
LAUNCHER_CREATION_POLICIES = ("AtStartup", "WaitForWorkersReady")
MANAGERS = ("kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue")
_GENERATED_SUFFIX = "xxxxx"  # the API server appends 5 random lower-case alphanumerics to generateName
_GENERATE_NAME_MAX = 58  # ...after cutting the prefix to 63 - 5 characters


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _controller_problems(job: dict, policies: bool) -> list[Problem]:
    problems: list[Problem] = []
    for key, allowed in (("apiVersion", API_VERSION), ("kind", KIND)):
        if key not in job:
            problems.append(Problem(key, "required field is missing"))
        elif job[key] != allowed:
            problems.append(Problem(key, _unsupported(job[key], [allowed])))
    meta = _d(job.get("metadata"))
    if not meta.get("name") and not meta.get("generateName"):
        problems.append(Problem("metadata.name", "required field is missing (or give metadata.generateName)"))
    spec = _d(job.get("spec"))  # no spec: the operator sees every default, and no replica specs

    def check_choice(obj: dict, key: str, allowed: Iterable[str], path: str) -> None:
        if obj.get(key) is not None and obj[key] not in allowed:
            problems.append(Problem(_child(path, key), _unsupported(obj[key], allowed)))

    def check_nonnegative(obj: dict, key: str, path: str) -> None:
        if _is_int(obj.get(key)) and obj[key] < 0:
            problems.append(Problem(_child(path, key), "must be >= 0"))

    check_nonnegative(spec, "slotsPerWorker", "spec")
    run_policy = _d(spec.get("runPolicy"))
    check_choice(run_policy, "cleanPodPolicy", CLEAN_POD_POLICIES, "spec.runPolicy")
    check_choice(run_policy, "managedBy", MANAGERS, "spec.runPolicy")
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        check_nonnegative(run_policy, key, "spec.runPolicy")
    # sshAuthMountPath "" is defaulted to /root/.ssh by the operator, so it passes.
    policy = spec.get("launcherCreationPolicy")
    if policies and policy is not None and policy not in LAUNCHER_CREATION_POLICIES:
        problems.append(Problem("spec.launcherCreationPolicy", POLICY + _unsupported(policy, LAUNCHER_CREATION_POLICIES)
                                + " (the CRD and the operator accept any value and treat it as WaitForWorkersReady)",
                                policy=True))

    replica_specs = spec.get("mpiReplicaSpecs")
    if replica_specs is None:
        problems.append(Problem("spec.mpiReplicaSpecs", "required field is missing"))
    if not isinstance(replica_specs, dict):
        return problems  # mistyped: the schema says so
    if replica_specs.get("Launcher") is None:
        problems.append(Problem("spec.mpiReplicaSpecs.Launcher",
                                "required field is missing (an MPIJob needs a launcher)"))
    for rtype, rspec in replica_specs.items():
        path = _child("spec.mpiReplicaSpecs", rtype)
        if rtype not in REPLICA_TYPES:
            if policies:
                problems.append(Problem(path, POLICY + _unsupported(rtype, REPLICA_TYPES)
                                        + " (the operator ignores other replica types)", policy=True))
            continue
        if not isinstance(rspec, dict):
            continue
        replicas = rspec.get("replicas")
        if rtype == "Launcher" and _is_int(replicas) and replicas != 1:  # absent: defaulted to 1
            problems.append(Problem(_child(path, "replicas"), "must be 1 (one launcher)"))
        elif rtype == "Worker" and replicas is None:
            problems.append(Problem(_child(path, "replicas"), "required field is missing (the operator's default "
                                                              "for a Worker, 0, is below its minimum of 1)"))
        elif rtype == "Worker" and _is_int(replicas) and replicas < 1:
            problems.append(Problem(_child(path, "replicas"), "must be >= 1"))
        if rspec.get("restartPolicy"):  # absent or "": defaulted (OnFailure for the launcher, Never for workers)
            check_choice(rspec, "restartPolicy", RESTART_POLICIES, path)
        if not _d(_d(rspec.get("template")).get("spec")).get("containers"):
            problems.append(Problem(_child(path, "template.spec.containers"), "must define at least one container"))
    problems += _hostname_problems(meta, replica_specs)
    return problems


def _hostname_problems(meta: dict, replica_specs: dict) -> list[Problem]:
    """Workers are Pods with hostnames `<name>-worker-<i>`, which must be DNS-1035 labels."""
    name, field = meta.get("name"), "metadata.name"
    if not isinstance(name, str) or not name:
        name, field = meta.get("generateName"), "metadata.generateName"
        if not isinstance(name, str) or not name:
            return []
        name = name[:_GENERATE_NAME_MAX] + _GENERATED_SUFFIX
    workers = _d(replica_specs.get("Worker"))
    count = workers["replicas"] if _is_int(workers.get("replicas")) and workers["replicas"] > 0 else 1
    hostname = f"{name}-worker-{count - 1}"
    if k8snames.dns1035_label(hostname):
        return [Problem(field, f"worker hostname {hostname!r} is not a DNS-1035 label (at most 63 characters, "
                               "a-z, 0-9 and '-', starting with a letter)")]
    return []


def _operator_volumes(spec: dict, rtype: str) -> dict[str, str]:
    """{volume name: mount path on the first container} of what the operator adds to REPLICA's pods."""
    added = {layout.OPERATOR_SSH_VOLUME: spec.get("sshAuthMountPath") or "/root/.ssh"}
    if rtype == "Launcher":
        added[layout.OPERATOR_CONFIG_VOLUME] = layout.OPERATOR_CONFIG_DIR
    return added


# ---------------------------------------------------------------------------------------------------
# Entry points

def validate_mpijob(obj: Any, *, schema: dict | None = None, pod_schema: bool = True,
                    policies: bool = True) -> list[Problem]:
    """Every problem of the MPIJob OBJ, sorted: against SCHEMA (a CRD openAPIV3Schema) or else BUILTIN_SCHEMA,
    the object's metadata, the controller rules, each pod template as the Pod the operator creates (with
    POD_SCHEMA, also against the v1 Pod schema), and with POLICIES, hvdk8s's own policies."""
    if not isinstance(obj, dict):
        return [Problem("", f"expected an MPIJob object, got {_json_type(obj)}")]
    problems = validate_schema(obj, BUILTIN_SCHEMA if schema is None else schema)
    pruned, _ = prune_nulls(obj)  # what the server stores: the operator works on that
    problems += _controller_problems(pruned, policies)
    spec = _d(pruned.get("spec"))
    for rtype, rspec in _d(spec.get("mpiReplicaSpecs")).items():
        if rtype in REPLICA_TYPES and isinstance(rspec, dict) and "template" in rspec:
            problems += validate_pod_template(_d(obj["spec"]["mpiReplicaSpecs"][rtype]).get("template"),
                                              f"spec.mpiReplicaSpecs.{rtype}.template", pod_schema=pod_schema,
                                              operator_volumes=_operator_volumes(spec, rtype), policies=policies)
    return sorted(set(problems))


def validate_documents(text_or_docs: Union[str, Iterable[Any]], *, schema: dict | None = None,
                       pod_schema: bool = True, policies: bool = True) -> list[Problem]:
    """Validate every MPIJob in a multi-document YAML text (or a list of loaded documents), e.g. a rendered
    directory's MPIJob + ConfigMap + others; other kinds are skipped. When there are several documents,
    each path is prefixed with the 1-based index of its document among the non-empty ones: `[doc 2] spec...`.
    No MPIJob at all is itself a problem."""
    if isinstance(text_or_docs, str):
        try:
            docs = safeyaml.loads(text_or_docs, max_bytes=MAX_YAML_BYTES)
        except safeyaml.YAMLInputError as exc:
            return [Problem("", str(exc))]
    else:
        docs = list(text_or_docs)
    docs = [doc for doc in docs if doc is not None]  # `---` separators leave empty documents
    problems: list[Problem] = []
    jobs = [(i, doc) for i, doc in enumerate(docs, 1) if isinstance(doc, dict) and doc.get("kind") == KIND]
    for i, job in jobs:
        for problem in validate_mpijob(job, schema=schema, pod_schema=pod_schema, policies=policies):
            path = f"[doc {i}] {problem.path or '(top level)'}" if len(docs) > 1 else problem.path
            problems.append(Problem(path, problem.message, problem.policy))
    if not jobs:
        problems.append(Problem("", f"no {KIND} document found"))
    return problems
