"""The entry points: one MPIJob object, or every MPIJob in a stream of YAML documents, through every layer
(see the package's docstring), all problems at once."""
from __future__ import annotations

from typing import Any, Iterable, Union

from hvdk8s.core import safeyaml

from ..api import API_VERSION, KIND, REPLICA_TYPES
from ..operator import added_volumes
from ..problems import Problem, json_type, unsupported
from .builtin import BUILTIN_SCHEMA
from .crd import MAX_YAML_BYTES
from .operator_rules import operator_problems
from .pod import validate_pod_template
from .policies import spec_policy_problems
from .schema import prune_nulls, validate_schema


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def validate_mpijob(obj: Any, *, schema: dict | None = None, pod_schema: bool = True,
                    policies: bool = True) -> list[Problem]:
    """Every problem of the MPIJob OBJ, sorted: against SCHEMA (a CRD openAPIV3Schema) or else BUILTIN_SCHEMA,
    the object's metadata, the operator's rules, each pod template as the Pod the operator creates (with
    POD_SCHEMA, also against the v1 Pod schema), and with POLICIES, hvdk8s's own policies."""
    if not isinstance(obj, dict):
        return [Problem("", f"expected an MPIJob object, got {json_type(obj)}")]
    problems = validate_schema(obj, BUILTIN_SCHEMA if schema is None else schema)
    pruned, _ = prune_nulls(obj)  # what the server stores: the operator works on that
    problems += _api_server_problems(pruned) + operator_problems(pruned)
    spec = _d(pruned.get("spec"))
    if policies:
        problems += spec_policy_problems(spec, "spec")
    for rtype, rspec in _d(spec.get("mpiReplicaSpecs")).items():
        if rtype in REPLICA_TYPES and isinstance(rspec, dict) and "template" in rspec:
            # The template as written: validate_pod_template prunes it itself, reporting null list items.
            problems += validate_pod_template(_d(obj["spec"]["mpiReplicaSpecs"][rtype]).get("template"),
                                              f"spec.mpiReplicaSpecs.{rtype}.template", pod_schema=pod_schema,
                                              operator_volumes=added_volumes(spec, rtype), policies=policies)
    return sorted(set(problems))


def _api_server_problems(job: dict) -> list[Problem]:
    """What the API server asks of the object before the operator sees it: this API's apiVersion and kind
    (the CRD's schema leaves them open), and a name (or generateName)."""
    problems = []
    for key, allowed in (("apiVersion", API_VERSION), ("kind", KIND)):
        if key not in job:
            problems.append(Problem(key, "required field is missing"))
        elif job[key] != allowed:
            problems.append(Problem(key, unsupported(job[key], [allowed])))
    meta = _d(job.get("metadata"))
    if not meta.get("name") and not meta.get("generateName"):
        problems.append(Problem("metadata.name", "required field is missing (or give metadata.generateName)"))
    return problems


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
