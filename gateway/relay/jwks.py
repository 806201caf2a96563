"""The issuer's signing keys (its JWK set), read over HTTP and kept for checking tokens.

Read when a token first needs them (its check waits for the read, at most `timeout_s`),
again once they are older than `ttl_s`, and again for a token naming a key id they do not
hold (the issuer rotated its keys), but never twice within `min_refetch_s`: a flood of
tokens with made-up key ids reads the set once, not once each. One read at a time: checks
that need a read meanwhile wait on the same one. A failed read keeps the keys read before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import httpx
import orjson
from jwt import PyJWK
from jwt.exceptions import PyJWTError

from gateway.errors import InvalidToken, ServiceUnavailable

logger = logging.getLogger(__name__)
DISCOVERY_PATH = "/.well-known/openid-configuration"
MAX_DOCUMENT_BYTES = 1 << 20  # a JWK set or discovery document larger than this is refused


def usable_keys(document: object, algorithms: Collection[str]) -> dict[str, PyJWK]:
    """The signing keys of a JWK set that verify one of `algorithms`, by key id (`""` for a
    key without one); keys for encryption, of other algorithms or unreadable are left out.
    ValueError: it is no JWK set."""
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the JWK set has no `keys` list")
    keys: dict[str, PyJWK] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        try:
            key = PyJWK(entry)
        except PyJWTError:
            continue
        if key.algorithm_name in algorithms:
            keys[str(entry.get("kid", ""))] = key
    return keys


class SigningKeys:
    """The issuer's current signing keys, read when needed (see the module's docstring)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        issuer: str,
        jwks_url: str | None,
        algorithms: Collection[str],
        ttl_s: float,
        min_refetch_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client, self._issuer, self._jwks_url = client, issuer.rstrip("/"), jwks_url
        self._algorithms = frozenset(algorithms)
        self._ttl_s, self._min_refetch_s, self._timeout_s = ttl_s, min_refetch_s, timeout_s
        self._clock = clock
        self._keys: dict[str, PyJWK] = {}
        self._read_at: float | None = None  # the last read that succeeded
        self._tried_at: float | None = None  # the last read begun
        self._lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None  # a stale set's read, held here
        self.reads = 0  # reads begun, for tests and logs

    def holds(self, kid: str | None) -> bool:
        """Whether the key a token named is still among the issuer's (a removed key's
        tokens are refused even where their check was remembered)."""
        return self._pick(kid) is not None

    async def find(self, kid: str | None) -> PyJWK:
        """The key a token's `kid` names (none named: the only key). Held but stale, it is
        used while the set is read again in the background; not held, the set is read
        first where a read is allowed now."""
        key = self._pick(kid)
        if key is not None:
            if not self._fresh() and self._may_read() and not self._lock.locked():
                self._background = asyncio.create_task(self._read_if_stale())
            return key
        async with self._lock:  # a read under way is waited for, not repeated
            if self._pick(kid) is None and self._may_read():
                await self._read()
        key = self._pick(kid)
        if key is not None:
            return key
        if self._read_at is None:
            raise ServiceUnavailable(
                "The token's issuer could not be asked for its signing keys; try again later",
                code="issuer_unavailable",
            )
        if kid is None:
            raise InvalidToken("The token names no key id (`kid`) and the issuer has several")
        raise InvalidToken(f"The token's key id `{kid[:64]}` is not among the issuer's keys")

    async def _read_if_stale(self) -> None:
        async with self._lock:
            if not self._fresh() and self._may_read():
                await self._read()

    def _pick(self, kid: str | None) -> PyJWK | None:
        if kid is None:
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    def _fresh(self) -> bool:
        return self._read_at is not None and self._clock() - self._read_at < self._ttl_s

    def _may_read(self) -> bool:
        return self._tried_at is None or self._clock() - self._tried_at >= self._min_refetch_s

    async def _read(self) -> None:
        """Read the JWK set (finding its URL first, where it is not configured); a failure
        is logged and keeps the keys there were."""
        self._tried_at, self.reads = self._clock(), self.reads + 1
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._jwks_url is None:
                    self._jwks_url = await self._discover()
                keys = usable_keys(await self._get_json(self._jwks_url), self._algorithms)
        except (httpx.HTTPError, ValueError, TimeoutError) as exc:
            logger.warning("reading the issuer's signing keys failed: %s", exc or type(exc))
            return
        self._keys, self._read_at = keys, self._clock()

    async def _discover(self) -> str:
        """The `jwks_uri` of the issuer's OpenID configuration."""
        document = await self._get_json(self._issuer + DISCOVERY_PATH)
        url = document.get("jwks_uri") if isinstance(document, dict) else None
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise ValueError("the issuer's OpenID configuration has no `jwks_uri`")
        return url

    async def _get_json(self, url: str) -> Any:
        response = await self._client.get(url, timeout=self._timeout_s)
        response.raise_for_status()
        if len(response.content) > MAX_DOCUMENT_BYTES:
            raise ValueError(f"{url} answered more than {MAX_DOCUMENT_BYTES} bytes")
        return orjson.loads(response.content)
