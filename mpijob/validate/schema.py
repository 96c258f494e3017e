"""Structural OpenAPI v3 schemas (the subset CRDs use), applied as the API server applies a CRD's: nulls of
non-nullable fields are pruned (or defaulted) first, null list items are errors, `x-kubernetes-list-type`
map and set lists must not repeat a key, and unknown fields are errors (a 1.20-era API server drops them
silently; newer kubectl, with strict field validation, refuses them). Knows nothing of MPIJobs: the
schema says it all, but for a custom resource's root metadata, which is always ObjectMeta."""
from __future__ import annotations

import re
from typing import Any

from ..problems import Problem, child, duplicates, json_type, repeated, unsupported
from .objectmeta import validate_object_meta

_INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "number":
        return json_type(value) in ("integer", "number")
    return json_type(value) == kind


def validate_schema(obj: Any, schema: dict, path: str = "") -> list[Problem]:
    """Every way OBJ breaks the structural schema SCHEMA; paths start at PATH."""
    if obj is None:
        return [] if schema.get("nullable") else [Problem(path, "must not be null")]
    problems: list[Problem] = []
    if schema.get("x-kubernetes-int-or-string"):
        if not (is_int(obj) or isinstance(obj, str)):
            return [Problem(path, f"expected integer or string, got {json_type(obj)}")]
    elif "type" in schema and not _type_ok(obj, schema["type"]):
        return [Problem(path, f"expected {schema['type']}, got {json_type(obj)}")]
    if "anyOf" in schema and all(validate_schema(obj, branch, path) for branch in schema["anyOf"]):
        forms = ", ".join(branch.get("type", "schema") for branch in schema["anyOf"])
        problems.append(Problem(path, f"matches none of the allowed forms ({forms})"))
    if "enum" in schema and obj not in schema["enum"]:
        problems.append(Problem(path, unsupported(obj, schema["enum"])))

    if isinstance(obj, dict):
        problems += _validate_object(obj, schema, path)
    elif isinstance(obj, list):
        problems += _validate_list(obj, schema, path)
    elif isinstance(obj, str):
        problems += _validate_string(obj, schema, path)
    elif json_type(obj) in ("integer", "number"):
        problems += _validate_number(obj, schema, path)
    return problems


def _validate_list(items: list, schema: dict, path: str) -> list[Problem]:
    problems: list[Problem] = []
    if "items" in schema:
        for i, item in enumerate(items):
            problems += validate_schema(item, schema["items"], child(path, i))
    problems += list_type_problems(items, schema, path)
    return problems + _size_problems(len(items), schema, path, ("minItems", "maxItems"), "must have {} items")


def _validate_string(text: str, schema: dict, path: str) -> list[Problem]:
    problems = []
    if "pattern" in schema and not re.search(schema["pattern"], text):
        problems.append(Problem(path, f"{text!r} does not match the pattern {schema['pattern']}"))
    return problems + _size_problems(len(text), schema, path, ("minLength", "maxLength"), "must be {} characters long")


def _size_problems(size: int, schema: dict, path: str, bounds: tuple[str, str], message: str) -> list[Problem]:
    """SIZE (of a list or a string) against SCHEMA's BOUNDS, the keys of its least and most; MESSAGE words a
    broken bound from "at least N" or "at most N"."""
    least, most = bounds
    problems = []
    if size < schema.get(least, 0):
        problems.append(Problem(path, message.format(f"at least {schema[least]}")))
    if most in schema and size > schema[most]:
        problems.append(Problem(path, message.format(f"at most {schema[most]}")))
    return problems


def _validate_number(number: Any, schema: dict, path: str) -> list[Problem]:
    problems = []
    if "minimum" in schema and number < schema["minimum"]:
        problems.append(Problem(path, f"must be >= {schema['minimum']}"))
    if "maximum" in schema and number > schema["maximum"]:
        problems.append(Problem(path, f"must be <= {schema['maximum']}"))
    if schema.get("format") in _INT_RANGES:
        low, high = _INT_RANGES[schema["format"]]
        if not low <= number <= high:
            problems.append(Problem(path, f"out of {schema['format']} range"))
    return problems


def field_schema(schema: dict, key: str) -> dict | None:
    """The schema of field KEY of an object under SCHEMA; None where it has none."""
    extra = schema.get("additionalProperties")
    return schema.get("properties", {}).get(key) or (extra if isinstance(extra, dict) else None)


def _pruned(value: Any, schema_of_field: dict | None) -> bool:
    """Whether the API server drops VALUE before validating: a null where the schema allows none (a default,
    if the field has one, takes its place)."""
    return value is None and schema_of_field is not None and not schema_of_field.get("nullable")


def list_type_problems(items: list, schema: dict, path: str) -> list[Problem]:
    """The repeats that SCHEMA's x-kubernetes-list-type (set, or map by its keys) forbids in ITEMS."""
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
    present = {k for k, v in obj.items() if not _pruned(v, field_schema(schema, k))}
    problems = [Problem(child(path, key), "required field is missing")
                for key in schema.get("required", ()) if key not in present and "default" not in properties.get(key, {})]
    extra = schema.get("additionalProperties", False)
    for key, value in obj.items():
        where = child(path, key)
        if key not in present:
            continue
        if key == "metadata" and path == "" and "properties" not in properties.get(key, {}):
            # A CRD's root metadata is always ObjectMeta, which its schema leaves open (`type: object`).
            problems += validate_object_meta(value, where)
        elif key in properties:
            problems += validate_schema(value, properties[key], where)
        elif isinstance(extra, dict):
            problems += validate_schema(value, extra, where)
        elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")):
            problems.append(Problem(where, "unknown field"))
    return problems


def prune_nulls(obj: Any, path: str = "") -> tuple[Any, list[Problem]]:
    """OBJ as the API server stores it under a schema with no nullable field (the MPIJob CRD's): null values
    of object fields dropped (a default, where the field has one, is valid in its place), and a Problem for
    each null list item, which the server refuses."""
    if isinstance(obj, dict):
        out, problems = {}, []
        for key, value in obj.items():
            if value is not None:
                out[key], found = prune_nulls(value, child(path, key))
                problems += found
        return out, problems
    if isinstance(obj, list):
        items, problems = [], []
        for i, value in enumerate(obj):
            if value is None:
                problems.append(Problem(child(path, i), "must not be null"))
            pruned, found = prune_nulls(value, child(path, i))
            items.append(pruned)
            problems += found
        return items, problems
    return obj, []
