"""ObjectMeta as the API server checks it on every object (apimachinery ValidateObjectMeta): an MPIJob's
own metadata, and the labels and annotations of its pod templates, which become the Pods'."""
from __future__ import annotations

from typing import Any

from hvdk8s.core import k8snames

from ..problems import Problem, child, json_type

MAX_ANNOTATIONS_BYTES = 256 * 1024  # keys and values together (TotalAnnotationSizeLimitB)


def validate_object_meta(meta: Any, path: str) -> list[Problem]:
    """Every way META (an object's metadata at PATH) breaks the API server's rules."""
    if not isinstance(meta, dict):
        return [Problem(path, f"expected object, got {json_type(meta)}")]
    problems = []
    for key, check in (("name", k8snames.dns1123_subdomain), ("generateName", k8snames.dns1123_subdomain),
                       ("namespace", k8snames.dns1123_label)):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            problems.append(Problem(child(path, key), f"expected string, got {json_type(value)}"))
            continue
        if key == "generateName" and value.endswith("-"):
            value = value[:-1] + "a"  # a prefix may end in '-': the server appends 5 random characters
        problems += [Problem(child(path, key), p) for p in check(value)]
    for key in ("labels", "annotations"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            problems.append(Problem(child(path, key), f"expected object, got {json_type(meta[key])}"))
    # A labels value that is not a map is reported above; its keys are checked only when it is one.
    problems += label_problems(meta.get("labels"), child(path, "labels"))
    problems += annotation_problems(meta.get("annotations"), child(path, "annotations"))
    return problems


def label_problems(labels: Any, path: str) -> list[Problem]:
    """Label keys and values (also a Pod's nodeSelector); LABELS that is not a map is left to the schema."""
    labels = labels if isinstance(labels, dict) else {}
    return [Problem(child(path, key), problem) for key, problem in k8snames.labels(labels)]


def annotation_problems(annotations: Any, path: str) -> list[Problem]:
    annotations = annotations if isinstance(annotations, dict) else {}
    out = [Problem(child(path, key), p) for key in annotations for p in k8snames.qualified_name(str(key))]
    size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        out.append(Problem(path, f"annotations take {size} bytes; at most {MAX_ANNOTATIONS_BYTES} are allowed"))
    return out
