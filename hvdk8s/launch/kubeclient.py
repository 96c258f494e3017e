"""Reaching a cluster as kubectl does, and saying plainly why it failed.

The kubeconfig is KUBECONFIG (a list of files, merged) or ~/.kube/config, the context is --context or the
current one, and the namespace is --namespace, else the context's, else `default`. Inside a pod with no
kubeconfig, the pod's service account is used. Every failure of the official client becomes a
`ClusterError`: one line of cause and remedy, which the CLI prints and exits 2 on.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from hvdk8s.core import suggest
from hvdk8s.core.errors import UserError

TIMEOUT = (10, 60)  # seconds to connect, and to read one answer (streams set their own)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
CLUSTER_INFO = "check that the cluster is up and that KUBECONFIG/--context name it (`kubectl cluster-info`)"


class ClusterError(UserError):
    """A cluster-side failure, already explained; `status` is the HTTP status when the server answered."""

    def __init__(self, message: str, problems=(), status: Optional[int] = None):
        super().__init__(message, problems)
        self.status = status


@dataclass
class Connection:
    api: Any  # kubernetes.client.ApiClient
    server: str
    context: Optional[str]  # None: in-cluster service account
    namespace: str  # the context's (or the pod's), `default` when it names none


def _require_client() -> None:
    import importlib.util

    if importlib.util.find_spec("kubernetes") is None:
        raise ClusterError("the cluster verbs need the Kubernetes client: pip install 'hvdk8s[cluster]'")


def kubeconfig_path(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def context_namespace(context: Optional[str] = None, kubeconfig: Optional[str] = None) -> Optional[str]:
    """The namespace the (current or named) context names, without contacting the cluster; None if the
    kubeconfig or context is missing or names none."""
    _require_client()
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig_path(kubeconfig)
    if not any(os.path.exists(p) for p in path.split(os.pathsep) if p):
        return None
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, ValueError):
        return None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    return ((chosen or {}).get("context") or {}).get("namespace")


def connect(context: Optional[str] = None, kubeconfig: Optional[str] = None) -> Connection:
    _require_client()
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    path = kubeconfig_path(kubeconfig)
    files = [p for p in path.split(os.pathsep) if p]
    if not any(os.path.exists(p) for p in files):
        if not kubeconfig and not os.environ.get("KUBECONFIG") and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)  # a pod: its service account
            namespace = _read(SERVICE_ACCOUNT_NAMESPACE) or "default"
            return Connection(client.ApiClient(cfg), cfg.host, None, namespace)
        raise ClusterError(f"no kubeconfig at {path}; set KUBECONFIG (or --kubeconfig) to your cluster's, "
                           "or run here with `hvdk8s launch --local`")
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)
        names = [c.get("name") for c in contexts]
        if context and context not in names:
            raise ClusterError(f"no context {context!r} in {path}; "
                               + suggest.hint(context, map(str, names), "pick one of"))
        if not context and not current:
            raise ClusterError(f"{path} sets no current context; pass --context (one of: {', '.join(map(str, names))})")
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)
    except ConfigException as e:
        raise ClusterError(f"cannot use kubeconfig {path}: {e}; fix it, or pick another with --context") from None
    chosen = next(c for c in contexts if c.get("name") == (context or current["name"]))
    cfg.retries = 1  # one retry on a dropped connection; a refused one is reported at once
    namespace = (chosen.get("context") or {}).get("namespace") or "default"
    return Connection(client.ApiClient(cfg), cfg.host, chosen["name"], namespace)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def server_message(e: Any) -> str:
    """The Status message in an ApiException's body (the server's own words), else its reason."""
    status = status_body(e)
    return str(status.get("message") or e.reason or f"HTTP {e.status}")


def status_body(e: Any) -> dict:
    try:
        body = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def explain(e: BaseException, conn: Connection, namespace: Optional[str] = None) -> ClusterError:
    """A ClusterError for any failure of a request to the cluster."""
    from kubernetes.client.exceptions import ApiException

    where = f" (context {conn.context})" if conn.context else ""
    if not isinstance(e, ApiException):
        return ClusterError(f"cannot reach the Kubernetes API server at {conn.server}{where}: {_network_reason(e)}; "
                            + CLUSTER_INFO)
    status, message = e.status, server_message(e)
    details = status_body(e).get("details") or {}
    if status == 401:
        whose = f"context {conn.context}" if conn.context else "this pod's service account"
        return ClusterError(f"the API server at {conn.server} rejected the credentials of {whose} (401 Unauthorized); "
                            "log in again or refresh the token in your kubeconfig", status=status)
    if status == 403:
        return ClusterError(f"forbidden: {message}; ask a cluster admin for a Role that allows it"
                            + (f" in namespace {namespace}" if namespace else "")
                            + ", or use a namespace/context where you have it", status=status)
    if status == 404 and details.get("kind") == "namespaces":
        missing = details.get("name") or namespace
        return ClusterError(f"namespace {missing} does not exist{where}; create it (`kubectl create namespace "
                            f"{missing}`) or choose another with --namespace", status=status)
    if status == 422:
        causes = [(c.get("field", ""), c.get("message", "")) for c in details.get("causes") or []]
        return ClusterError(f"the API server refused the object: {message}", causes, status=status)
    return ClusterError(f"the API server at {conn.server} answered {status} {e.reason}: {message}", status=status)


def _network_reason(e: BaseException) -> str:
    """The innermost cause of a connection failure, shortened (urllib3 nests them)."""
    import ssl

    import urllib3

    seen = e
    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        seen = e.reason
    text = str(seen)
    if isinstance(seen, (ssl.SSLError, urllib3.exceptions.SSLError)):
        return f"TLS failed ({text.split(':')[-1].strip(' )') or text}): the kubeconfig's certificate authority " \
               "does not vouch for this server"
    for marker, plain in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                          ("Name or service not known", "unknown host"), ("No route to host", "no route to host"),
                          ("Connection reset", "connection reset"), ("RemoteDisconnected", "connection closed")):
        if marker in text:
            return plain
    return text


@contextmanager
def translated(conn: Connection, namespace: Optional[str] = None) -> Iterator[None]:
    """Turn any failure of the client inside the block into a ClusterError (ours pass through)."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ClusterError:
        raise
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise explain(e, conn, namespace) from None
