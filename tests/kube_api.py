"""A stand-in for the Kubernetes API server's EndpointSlice routes, on a free 127.0.0.1 port.

No real API server can be had here: Debian packages no kube-apiserver and its release
binaries and Go modules are not reachable from this machine. So the tests run the gateway
against this server instead, which speaks the documented protocol of
`discovery.k8s.io/v1` EndpointSlices for what discovery uses: list by label selector with a
`resourceVersion`, and watch from one (chunked JSON lines of ADDED, MODIFIED, DELETED,
BOOKMARK and ERROR events; a version older than the last compaction answered with an ERROR
event carrying a 410 `Expired` Status), with bearer-token authentication and a namespace
the token may read (RBAC) answered 401/403 with a Status as the real server does.
tests/unit/test_kube_api.py reads it with the official Kubernetes Python client, so its
answers are what a real client parses.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/apis/discovery.k8s.io/v1/namespaces/"
SERVICE_NAME = "kubernetes.io/service-name"
POLL_S = 0.05


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A failure Status, as the API server answers errors."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class KubeApi:
    """EndpointSlices in memory, changed by the test, listed and watched over HTTP."""

    def __init__(self, token: str, namespaces: set[str]) -> None:
        self.token, self.namespaces = token, set(namespaces)  # what the token may read
        self._changed = threading.Condition()
        self._slices: dict[tuple[str, str], dict[str, Any]] = {}
        self._events: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, object)
        self._version, self._compacted = 100, 0
        self._generation = 0  # bumped to end every open watch
        self._failing: tuple[int, str] | None = None
        self.requests: list[dict[str, Any]] = []  # each request's path, query and token
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> KubeApi:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.end_watches()
        self._server.shutdown()
        self._server.server_close()

    # What the test changes.

    def set_endpoints(
        self,
        namespace: str,
        service: str,
        endpoints: Mapping[str, bool],
        *,
        slice_name: str | None = None,
        address_type: str = "IPv4",
    ) -> None:
        """Write the slice `slice_name` (default `<service>-1`) of `service`: each address
        with its ready condition (False: a pod not ready, or terminating)."""
        name = slice_name or f"{service}-1"
        with self._changed:
            created = (namespace, name) not in self._slices
            self._version += 1
            item = {
                "kind": "EndpointSlice",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {SERVICE_NAME: service},
                    "resourceVersion": str(self._version),
                },
                "addressType": address_type,
                "endpoints": [
                    {
                        "addresses": [address],
                        "conditions": {
                            "ready": ready,
                            "serving": ready,
                            "terminating": not ready,
                        },
                        "targetRef": {"kind": "Pod", "namespace": namespace, "name": address},
                    }
                    for address, ready in endpoints.items()
                ],
                "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            }
            self._slices[(namespace, name)] = item
            self._record("ADDED" if created else "MODIFIED", item)

    def delete_slice(self, namespace: str, name: str) -> None:
        with self._changed:
            item = self._slices.pop((namespace, name))
            self._version += 1
            item = {**item, "metadata": {**item["metadata"], "resourceVersion": str(self._version)}}
            self._record("DELETED", item)

    def bookmark(self) -> None:
        """Tell open watches (those that allow bookmarks) of a newer resourceVersion, as the
        server does when other resources change."""
        with self._changed:
            self._version += 1
            marker = {
                "kind": "EndpointSlice",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self._version)},
            }
            self._record("BOOKMARK", marker)

    def compact(self) -> None:
        """Forget the history: a watch from any version seen so far gets 410 Expired."""
        with self._changed:
            self._compacted = self._version + 1
            self._events.clear()

    def end_watches(self) -> None:
        """Close every open watch, as the server does at a watch's timeout or a restart."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def fail(self, code: int | None, reason: str = "ServiceUnavailable") -> None:
        """Answer every request with a `code` Status (None: serve again); open watches end."""
        with self._changed:
            self._failing = None if code is None else (code, reason)
        if code is not None:
            self.end_watches()

    def watches(self) -> int:
        """How many watch requests have been made."""
        return sum(1 for r in self.requests if r["query"].get("watch") in ("true", "1"))

    def wait_for(self, condition: Any, timeout_s: float = 20.0) -> None:
        """Block until `condition()` holds (a deadline, not a wait)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("the stand-in API server never saw what was expected")
            time.sleep(POLL_S)

    # What the server does.

    def _record(self, kind: str, item: dict[str, Any]) -> None:
        self._events.append((self._version, kind, json.loads(json.dumps(item))))
        self._changed.notify_all()

    def _selected(self, namespace: str, selector: str | None) -> list[dict[str, Any]]:
        wanted = _service(selector)
        return [
            item
            for (ns, _), item in sorted(self._slices.items())
            if ns == namespace
            and (wanted is None or item["metadata"]["labels"].get(SERVICE_NAME) == wanted)
        ]

    def _answer(self, path: str, query: dict[str, str], token: str) -> tuple[int, Any]:
        """A request's status and body: a dict to send whole, or a watch's events."""
        self.requests.append({"path": path, "query": query, "token": token})
        if self._failing is not None:
            code, reason = self._failing
            return code, status(code, reason, "the stand-in is failing")
        if token != f"Bearer {self.token}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        namespace, _, resource = path.removeprefix(PREFIX).partition("/")
        if not path.startswith(PREFIX) or resource != "endpointslices":
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        if namespace not in self.namespaces:
            return 403, status(
                403,
                "Forbidden",
                'endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:'
                'draftgate:draftgate-gateway" cannot list resource "endpointslices" in API '
                f'group "discovery.k8s.io" in the namespace "{namespace}"',
            )
        selector = query.get("labelSelector")
        if query.get("watch") in ("true", "1"):
            return 200, self._events_for(namespace, selector, query)
        with self._changed:
            items, version = self._selected(namespace, selector), self._version
        listed = {
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": str(version)},
            "items": items,
        }
        return 200, listed

    def _events_for(
        self, namespace: str, selector: str | None, query: dict[str, str]
    ) -> Iterator[dict[str, Any]]:
        """A watch's events, as they happen, until its timeout or `end_watches`."""
        wanted, bookmarks = _service(selector), query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        with self._changed:
            generation, version = self._generation, query.get("resourceVersion") or ""
            if version in ("", "0"):  # from now, the current state first
                first = [
                    {"type": "ADDED", "object": i} for i in self._selected(namespace, selector)
                ]
                seen = self._version
            elif int(version) < self._compacted:
                gone = status(410, "Expired", f"too old resource version: {version}")
                first, seen = [{"type": "ERROR", "object": gone}], -1
            else:
                first, seen = [], int(version)
        yield from first
        if seen < 0:
            return
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda after=seen: self._version > after or self._generation != generation,
                    timeout=min(POLL_S * 4, max(deadline - time.monotonic(), 0)),
                )
                if self._generation != generation or time.monotonic() > deadline:
                    return
                events = [e for e in self._events if e[0] > seen]
                seen = self._version
            for _, kind, item in events:
                labels = item["metadata"].get("labels", {})
                if kind == "BOOKMARK":
                    if bookmarks:
                        yield {"type": kind, "object": item}
                elif item["metadata"]["namespace"] == namespace and wanted in (
                    None,
                    labels.get(SERVICE_NAME),
                ):
                    yield {"type": kind, "object": item}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                token = self.headers.get("Authorization", "")
                code, body = api._answer(url.path, query, token)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                if isinstance(body, dict):
                    data = json.dumps(body).encode()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in body:
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

        return Handler


def _service(selector: str | None) -> str | None:
    """The Service a `kubernetes.io/service-name=<name>` selector names (None: any)."""
    if not selector:
        return None
    key, _, value = selector.replace("==", "=").partition("=")
    if key != SERVICE_NAME:
        raise ValueError(f"the stand-in only selects by {SERVICE_NAME}, not {selector!r}")
    return value
