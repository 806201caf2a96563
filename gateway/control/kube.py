"""A Service's ready endpoints, kept current through the Kubernetes API.

The API's own list + watch protocol (`discovery.k8s.io/v1` EndpointSlices): list the
Service's slices (label `kubernetes.io/service-name`), then watch from the list's
`resourceVersion`, applying ADDED/MODIFIED/DELETED events and following BOOKMARKs; when the
server ends a watch (its timeout) watch again from the last version; when that version is
too old (410 Gone) list again. An endpoint is a member while its `ready` condition holds (an
absent condition means ready, as the API says; a terminating pod is not ready).

In a pod, the API server, token and namespace come from the service account Kubernetes
mounts (`/var/run/secrets/kubernetes.io/serviceaccount`) and the `KUBERNETES_SERVICE_*`
environment; the token is read again at every connection, as bound tokens rotate.
deploy/k8s/base/rbac.yaml grants the least it needs: get, list and watch on endpointslices
in its namespace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
WATCH_TIMEOUT_S = 290  # the server ends each watch by then; we watch again from where it was
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # between attempts after a failure, then 30 s each


class KubeError(Exception):
    """The API could not be read: the reason, as the API server or the connection gave it."""


class Expired(KubeError):
    """A watch's resourceVersion is too old (410 Gone): list again."""


@dataclass(frozen=True)
class ServiceAccount:
    """Where the API server is and who the gateway is to it."""

    api_url: str
    token_file: Path | None = None
    ca_file: Path | None = None
    namespace: str = "default"

    @classmethod
    def in_cluster(cls, directory: Path, api_url: str | None) -> ServiceAccount | None:
        """The pod's service account (None outside a cluster with no `api_url` given)."""
        if api_url is None:
            host, port = (
                os.environ.get("KUBERNETES_SERVICE_HOST"),
                os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
            )
            if not host:
                return None
            api_url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        token, ca, namespace = (directory / n for n in ("token", "ca.crt", "namespace"))
        return cls(
            api_url=api_url.rstrip("/"),
            token_file=token if token.is_file() else None,
            ca_file=ca if ca.is_file() else None,
            namespace=namespace.read_text().strip() if namespace.is_file() else "default",
        )

    def client(self) -> httpx.AsyncClient:
        """A client for the API server, trusting the cluster's CA when it has one."""
        verify: ssl.SSLContext | bool = True
        if self.ca_file is not None:
            verify = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.AsyncClient(
            base_url=self.api_url,
            verify=verify,
            timeout=httpx.Timeout(10.0, read=WATCH_TIMEOUT_S + 30.0),
            trust_env=False,
        )

    def headers(self) -> dict[str, str]:
        """The bearer token, read now (a bound token is rotated by the kubelet)."""
        if self.token_file is None:
            return {}
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}


def ready_addresses(endpoint_slice: dict[str, Any]) -> frozenset[str]:
    """The IP addresses of a slice's ready endpoints (FQDN slices have none we can use)."""
    if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
        return frozenset()
    return frozenset(
        address
        for endpoint in endpoint_slice.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready") is not False
        for address in endpoint.get("addresses") or []
    )


@dataclass
class EndpointSliceWatch:
    """One Service's ready addresses, listed then watched until stopped."""

    client: httpx.AsyncClient
    account: ServiceAccount
    namespace: str
    service: str
    on_change: Callable[[], None] = lambda: None
    slices: dict[str, frozenset[str]] = field(default_factory=dict)
    listed: bool = False  # a list has answered since the start
    error: str | None = None  # why the last list or watch failed, until one works again
    version: str = ""

    @property
    def path(self) -> str:
        return f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"

    @property
    def source(self) -> str:
        return f"service {self.namespace}/{self.service}"

    def addresses(self) -> frozenset[str]:
        """Every ready address in the Service's slices, as last seen."""
        return frozenset().union(*self.slices.values())

    async def run(self) -> None:
        """List and watch, again after each failure (backing off), until cancelled."""
        failures = 0
        while True:
            try:
                if not self.version:
                    await self._list()
                await self._watch()
                failures = 0
            except Expired:
                self.version = ""  # list again at once
            except (KubeError, httpx.HTTPError, ValueError, KeyError) as exc:
                self._failed(str(exc) or type(exc).__name__)
                await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
                failures += 1

    async def _list(self) -> None:
        params = {"labelSelector": f"{SERVICE_NAME_LABEL}={self.service}"}
        response = await self.client.get(self.path, params=params, headers=self.account.headers())
        body = _answer(response)
        before = self.addresses()
        self.slices = {item["metadata"]["name"]: ready_addresses(item) for item in body["items"]}
        self.version = body["metadata"]["resourceVersion"]
        self.listed, self.error = True, None
        if self.addresses() != before:
            self.on_change()

    async def _watch(self) -> None:
        """One watch, to its end (the server's timeout, or a failure)."""
        params = {
            "labelSelector": f"{SERVICE_NAME_LABEL}={self.service}",
            "watch": "true",
            "resourceVersion": self.version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        request = self.client.stream(
            "GET", self.path, params=params, headers=self.account.headers()
        )
        async with request as response:
            if response.status_code != 200:
                await response.aread()
                _answer(response)
            self.error = None
            async for line in response.aiter_lines():
                if line.strip():
                    self._apply(json.loads(line))

    def _apply(self, event: dict[str, Any]) -> None:
        kind, item = event["type"], event["object"]
        if kind == "ERROR":
            _raise_status(item)
        self.version = item["metadata"].get("resourceVersion") or self.version
        if kind == "BOOKMARK":
            return
        before = self.addresses()
        name = item["metadata"]["name"]
        if kind == "DELETED":
            self.slices.pop(name, None)
        else:  # ADDED, MODIFIED
            self.slices[name] = ready_addresses(item)
        if self.addresses() != before:
            self.on_change()

    def _failed(self, why: str) -> None:
        if self.error != why:
            logger.warning("%s: %s (its members last seen are kept)", self.source, why)
        self.error = why


def _answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a 200, or the API's Status as a KubeError."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code == 200:
        return body  # type: ignore[no-any-return]
    if body.get("kind") == "Status":
        _raise_status(body)
    raise KubeError(f"{response.status_code} from the Kubernetes API")


def _raise_status(status: dict[str, Any]) -> None:
    """A failure Status (a watch's ERROR event, or an error answer) as an exception."""
    code, message = status.get("code"), status.get("message") or status.get("reason")
    if code == 410:
        raise Expired(message or "resource version too old")
    raise KubeError(f"{code} {status.get('reason', '')}: {message}".strip())
