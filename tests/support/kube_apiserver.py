"""A stand-in for the Kubernetes API server's Pod list and watch, speaking the real protocol over real HTTP.

What it serves, as kube-apiserver does:

- ``GET /api/v1/namespaces/{ns}/pods?labelSelector=...``: a ``PodList`` whose ``metadata.resourceVersion`` is the
  version the list was taken at;
- ``GET ...&watch=true&resourceVersion=N``: a chunked stream of newline-delimited events (``ADDED``,
  ``MODIFIED``, ``DELETED``; ``BOOKMARK`` when ``allowWatchBookmarks=true``) after version ``N``; without a
  version, ``ADDED`` for every matching pod, then what follows. A pod whose labels stop (or start) matching is
  sent as ``DELETED`` (or ``ADDED``), as the watch cache does. ``timeoutSeconds`` ends the stream cleanly;
- a version older than the compaction floor (:meth:`KubeApiServer.compact`) is answered with an ``ERROR`` event
  carrying a ``Status`` of code 410 (``Expired``), or, with ``gone_as_http=True``, with HTTP 410 itself.

Tests drive it: :meth:`add_pod`, :meth:`set_ready`, :meth:`delete_pod`, :meth:`compact`, :meth:`drop_watches`
(connections cut without the terminating chunk, as a dying server or a load balancer does), :meth:`stop` and
:meth:`start` again on the same port (an API server outage), and :meth:`kubeconfig` for the client.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

_WAIT_S = 0.2


class KubeApiServer:
    """Pods in namespaces, versioned; list and watch over HTTP on 127.0.0.1."""

    def __init__(self, port: int = 0, *, bookmark_every_s: float = 1.0) -> None:
        self._lock = threading.Condition()
        self._version = 100
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._log: list[tuple[int, str, dict[str, Any], dict[str, Any] | None]] = []
        """Every change: (version, type, the pod after, the pod before)."""
        self._floor = 0
        self._watches: set[socket.socket] = set()
        self._bookmark_every_s = bookmark_every_s
        self.gone_as_http = False
        self.requests: list[str] = []
        """Every request's path and query, in order."""
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self.start()

    # -- the server ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", self._port), _handler(self))
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop answering and cut every watch: the API server is gone (its state is kept for :meth:`start`)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        self.drop_watches()

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig pointing at this server (plain HTTP, no credentials), written to ``path``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {}}],
            "contexts": [
                {"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in", "namespace": namespace}}
            ],
            "current-context": "stand-in",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- what tests do -----------------------------------------------------------------------------------

    def add_pod(
        self,
        name: str,
        ip: str,
        *,
        port: int,
        labels: dict[str, str],
        namespace: str = "default",
        ready: bool = True,
        port_name: str = "http",
    ) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "uid": f"uid-{name}"},
            "spec": {
                "containers": [
                    {"name": "engine", "image": "sglang", "ports": [{"name": port_name, "containerPort": port}]}
                ]
            },
            "status": {"phase": "Running", "podIP": ip, "conditions": [_ready_condition(ready)]},
        }
        self._change("ADDED", namespace, name, pod)

    def set_ready(self, name: str, ready: bool, namespace: str = "default") -> None:
        with self._lock:
            pod = copy.deepcopy(self._pods[(namespace, name)])
        pod["status"]["conditions"] = [_ready_condition(ready)]
        self._change("MODIFIED", namespace, name, pod)

    def set_labels(self, name: str, labels: dict[str, str], namespace: str = "default") -> None:
        with self._lock:
            pod = copy.deepcopy(self._pods[(namespace, name)])
        pod["metadata"]["labels"] = dict(labels)
        self._change("MODIFIED", namespace, name, pod)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        self._change("DELETED", namespace, name, None)

    def compact(self) -> None:
        """Forget every version up to now: a watch resuming from an older one is answered 410 Gone."""
        with self._lock:
            self._floor = self._version
            self._log.clear()

    def drop_watches(self) -> None:
        """Cut every open watch mid-stream, without the chunked stream's end."""
        with self._lock:
            watches, self._watches = list(self._watches), set()
            self._lock.notify_all()
        for sock in watches:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    def wait_for_watches(self, count: int = 1, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.open_watches() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} watch(es) not opened within {timeout}s")
            time.sleep(0.02)

    # -- the store -------------------------------------------------------------------------------------

    def _change(self, kind: str, namespace: str, name: str, pod: dict[str, Any] | None) -> None:
        with self._lock:
            self._version += 1
            before = self._pods.get((namespace, name))
            if pod is None:
                if before is None:
                    raise KeyError(name)
                gone = copy.deepcopy(before)
                gone["metadata"]["resourceVersion"] = str(self._version)
                del self._pods[(namespace, name)]
                self._log.append((self._version, kind, gone, before))
            else:
                pod = copy.deepcopy(pod)
                pod["metadata"]["resourceVersion"] = str(self._version)
                self._pods[(namespace, name)] = pod
                self._log.append((self._version, kind, pod, before))
            self._lock.notify_all()

    def _list(self, namespace: str, selector: str) -> dict[str, Any]:
        with self._lock:
            items = [
                copy.deepcopy(pod)
                for (ns, _), pod in sorted(self._pods.items())
                if ns == namespace and _matches(selector, pod)
            ]
            version = self._version
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(version)}, "items": items}

    def _events_after(self, version: int, namespace: str, selector: str) -> tuple[list[dict[str, Any]], int]:
        """The watch events after ``version`` for this namespace and selector, and the version they reach."""
        events = []
        for number, kind, pod, before in self._log:
            if number <= version or pod["metadata"]["namespace"] != namespace:
                continue
            now_matches = kind != "DELETED" and _matches(selector, pod)
            matched = before is not None and _matches(selector, before)
            if kind == "DELETED":
                if matched:
                    events.append({"type": "DELETED", "object": pod})
            elif now_matches:
                events.append({"type": "MODIFIED" if matched else "ADDED", "object": pod})
            elif matched:
                events.append({"type": "DELETED", "object": pod})
        return events, self._version

    # -- HTTP ------------------------------------------------------------------------------------------

    def serve(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        self.requests.append(handler.path)
        segments = parts.path.strip("/").split("/")
        if len(segments) != 5 or segments[:3] != ["api", "v1", "namespaces"] or segments[4] != "pods":
            _json(handler, 404, _status(404, "NotFound", f"the server could not find {parts.path}"))
            return
        namespace = segments[3]
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        selector = query.get("labelSelector", "")
        if query.get("watch") not in ("true", "1"):
            _json(handler, 200, self._list(namespace, selector))
            return
        self._watch(handler, namespace, selector, query)

    def _watch(self, handler: BaseHTTPRequestHandler, namespace: str, selector: str, query: dict[str, str]) -> None:
        asked = query.get("resourceVersion")
        timeout = float(query.get("timeoutSeconds", "0") or 0)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        with self._lock:
            if asked not in (None, "", "0") and int(asked) < self._floor:
                expired = _status(410, "Expired", f"too old resource version: {asked} ({self._floor})")
                if self.gone_as_http:
                    _json(handler, 410, expired)
                    return
                first: list[dict[str, Any]] = [{"type": "ERROR", "object": expired}]
                version = self._version
            elif asked in (None, "", "0"):
                listing = self._list(namespace, selector)
                first = [{"type": "ADDED", "object": pod} for pod in listing["items"]]
                version = int(listing["metadata"]["resourceVersion"])
            else:
                first, version = [], int(asked)
            sock = handler.connection
            self._watches.add(sock)
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        try:
            for event in first:
                _chunk(handler, event)
            if first and first[0]["type"] == "ERROR":
                _end(handler)
                return
            started = last_sent = time.monotonic()
            while True:
                with self._lock:
                    if sock not in self._watches:
                        return  # dropped: no end chunk
                    events, version_now = self._events_after(version, namespace, selector)
                    if not events:
                        self._lock.wait(_WAIT_S)
                        events, version_now = self._events_after(version, namespace, selector)
                    if sock not in self._watches:
                        return
                for event in events:
                    _chunk(handler, event)
                    last_sent = time.monotonic()
                version = version_now
                now = time.monotonic()
                if bookmarks and now - last_sent >= self._bookmark_every_s:
                    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(version)}}
                    _chunk(handler, {"type": "BOOKMARK", "object": bookmark})
                    last_sent = now
                if timeout and now - started >= timeout:
                    _end(handler)
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._watches.discard(sock)


def _handler(api: KubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            api.serve(self)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _ready_condition(ready: bool) -> dict[str, str]:
    return {"type": "Ready", "status": "True" if ready else "False"}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _chunk(handler: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
    line = json.dumps(event).encode() + b"\n"
    handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
    handler.wfile.flush()


def _end(handler: BaseHTTPRequestHandler) -> None:
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()


def _matches(selector: str, pod: dict[str, Any]) -> bool:
    """Equality, inequality, set and existence terms, as kube-apiserver reads ``labelSelector``."""
    labels = pod["metadata"].get("labels") or {}
    for term in _split(selector):
        words = term.split()
        if len(words) >= 2 and words[1] in ("in", "notin"):
            values = {v.strip() for v in term.split("(", 1)[1].rstrip(")").split(",")}
            inside = labels.get(words[0]) in values
            if inside != (words[1] == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term and term not in labels:
            return False
    return True


def _split(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms
