"""The kubelet log endpoint of kwok's nodes, served on 127.0.0.1 for the API server to proxy `pods/log` to.

kwok runs pods on paper: no container writes a log. What the API server does for
`GET /api/v1/namespaces/NS/pods/POD/log?follow=true` is real all the same: it finds the pod's node,
reads that Node's InternalIP and kubelet port, and streams `GET https://IP:PORT/containerLogs/NS/POD/
CONTAINER?follow=true` back to the client, over TLS verified against the cluster's CA, with its kubelet
client certificate. kwok's own server answers that path too, but its follows never end (it cannot tell
that a container exited), so the cluster's kwok nodes advertise this server's port instead: it requires
the API server's client certificate, and serves each container's log from a `Feed` the test writes to
(chunked, as a kubelet streams it), ended by `close` when the test ends the container.
"""
from __future__ import annotations

import http.server
import ssl
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Optional


class Feed:
    """A container's log: lines appended by the test; `close` ends it (the container exited)."""

    def __init__(self):
        self.lines: list[str] = []
        self.closed = False
        self.cond = threading.Condition()

    def write(self, *lines: str) -> None:
        with self.cond:
            self.lines.extend(lines)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def read_from(self, index: int, follow: bool, timeout: float = 0.5) -> tuple[list[str], bool]:
        """Lines after `index`, and whether the log has ended (for a snapshot: always)."""
        with self.cond:
            if follow and index >= len(self.lines) and not self.closed:
                self.cond.wait(timeout)
            return self.lines[index:], self.closed or not follow


class FakeKubelet:
    """Bound at once (the cluster's nodes are given its port); serves once `serve` has the certificates."""

    def __init__(self):
        self.feeds: dict[tuple[str, str, str], Feed] = {}
        self.requests: list[tuple[str, Optional[str]]] = []  # (path, client certificate's CN)
        kubelet = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                peer = self.connection.getpeercert() or {}
                cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), None)
                kubelet.requests.append((self.path, cn))
                parts = url.path.strip("/").split("/")
                if parts[0] != "containerLogs" or len(parts) != 4:
                    self.send_error(404, "no such path")
                    return
                feed = kubelet.feed(*parts[1:4])  # a container nobody wrote to yet: an empty log
                follow = urllib.parse.parse_qs(url.query).get("follow") == ["true"]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = 0
                while True:
                    lines, ended = feed.read_from(sent, follow)
                    if lines:
                        data = "".join(line + "\n" for line in lines).encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        sent += len(lines)
                    if ended and not feed.read_from(sent, False)[0]:
                        break
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def serve(self, certs: Path) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs / "kubelet.crt", certs / "kubelet.key")
        context.load_verify_locations(certs / "ca.crt")
        context.verify_mode = ssl.CERT_REQUIRED  # only the API server (its kubelet client certificate) gets in
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def feed(self, namespace: str, pod: str, container: str) -> Feed:
        return self.feeds.setdefault((namespace, pod, container), Feed())

    def wait_for_followers(self, namespace: str, pod: str, container: str, count: int, timeout: float = 60) -> None:
        """Until the API server has opened `count` follows of this container's log (a test that changes
        the log under a follower must know the follower is reading it: its start-up takes seconds)."""
        path = f"/containerLogs/{namespace}/{pod}/{container}?follow=true"
        deadline = time.monotonic() + timeout
        while sum(1 for p, _ in list(self.requests) if p == path) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {count} follow(s) of {path} within {timeout}s: {self.requests}")
            time.sleep(0.05)

    def close(self) -> None:
        for feed in self.feeds.values():
            feed.close()
        if hasattr(self, "thread"):
            self.server.shutdown()
        self.server.server_close()
