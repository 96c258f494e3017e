"""The one reader of the MPIJob CustomResourceDefinition: from a file (`hvdk8s validate --crd`), or from the
cluster through the official Kubernetes client (`--crd-from-cluster`, and `hvdk8s launch` before it
creates a job). Either way the result is the openAPIV3Schema of one version, which `schema` applies."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from hvdk8s.core import safeyaml

from ..api import CRD_NAME, GROUP, KIND, VERSION

MAX_YAML_BYTES = 8 << 20  # a CRD file (mpi-operator's is about 0.7 MB) or a stream of many MPIJobs


def load_crd_schema(source: Union[str, Path, dict], version: str = VERSION) -> dict:
    """The openAPIV3Schema of VERSION in the MPIJob CustomResourceDefinition SOURCE (a YAML/JSON file or a dict)."""
    if isinstance(source, dict):
        return _crd_version_schema(source, version, "the given CRD")
    return _crd_version_schema(_read_crd(source), version, str(source))


def served_crd_schema(api_client: Any, version: str = VERSION, timeout: Any = None) -> Optional[dict]:
    """The openAPIV3Schema of VERSION in the MPIJob CRD that the cluster of API_CLIENT (a kubernetes
    ApiClient) serves; None where it is not installed or we may not read it (reading CRDs is often not
    granted to users who may run jobs). Other API errors propagate, for the caller to explain."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        # Raw JSON, not the client's model objects: the schema must stay the plain dict the server sent.
        response = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
            CRD_NAME, _preload_content=False, _request_timeout=timeout)
    except ApiException as e:
        if e.status in (403, 404):
            return None
        raise
    return load_crd_schema(json.loads(response.data), version)


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


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


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
