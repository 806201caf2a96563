"""The relay's client for backends: aiohttp's `ClientSession`, with nothing in between.

httpx over aiohttp's transport, which the relay used before, builds an httpx request per
call, merges URLs and cookies and wraps every chunk: at 256 streams of 32 chunks that was a
fifth of the gateway's CPU (py-spy), for features a relay does not use. The control loops
keep httpx (probes, scrapes, benchmarks: few requests, and `transport=` as the test seam).

Every failure the relay must tell apart is one of three exceptions here, raised before the
response head (`send`) or while reading the body: `UpstreamUnreachable`, `UpstreamTimedOut`
and, for a body cut short, `UpstreamBroke`. Each carries a short reason for the client's
error message, in the names these messages have always used (`ConnectError`,
`ConnectTimeout`, `ReadTimeout`, `ReadError`), not aiohttp's class names.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from gateway.settings import Settings

# vLLM closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); dropping ours
# sooner means a request never goes out on a connection vLLM is closing at that instant.
UPSTREAM_KEEPALIVE_S = 4.0


class UpstreamUnreachable(Exception):
    """No answer head from the backend: refused, reset, unusable URL, no free connection."""


class UpstreamTimedOut(Exception):
    """The backend stayed silent past `read_timeout_s` (or the connection past its timeouts)."""


class UpstreamBroke(Exception):
    """The backend's body ended early or broke after its head."""


class UpstreamResponse:
    """A backend's answer whose head has arrived; its body is read once, then closed."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.headers = response.headers  # case-insensitive

    async def aread(self) -> bytes:
        """The whole body."""
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _broke(exc) from exc

    async def next_chunk(self) -> bytes:
        """What has arrived of the body since the last call, waiting for some; b"" at its
        end (decoded if the backend compressed it anyway). A coroutine, not an iterator: one
        layer less per chunk than `async for` over aiohttp's own iterator."""
        try:
            return await self._response.content.readany()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _broke(exc) from exc

    async def aclose(self) -> None:
        """Give the connection back (or drop it, if its body was not read to the end)."""
        self._response.release()


def _broke(exc: BaseException) -> UpstreamBroke | UpstreamTimedOut:
    """The failure of a body being read: silent too long, or cut."""
    return (
        UpstreamTimedOut("ReadTimeout")
        if isinstance(exc, TimeoutError)
        else UpstreamBroke("ReadError")
    )


class Upstream:
    """Sends the relay's requests over one pool of kept-alive connections."""

    def __init__(self, settings: Settings) -> None:
        connector = aiohttp.TCPConnector(
            limit=settings.upstream_max_connections,
            limit_per_host=0,
            keepalive_timeout=UPSTREAM_KEEPALIVE_S,
        )
        # `connect` covers waiting for a free connection and opening one; `sock_read` the
        # silence allowed before the head and between chunks; no bound on a whole stream.
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.pool_timeout_s + settings.connect_timeout_s,
            sock_connect=settings.connect_timeout_s,
            sock_read=settings.read_timeout_s,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),  # a relay keeps no backend's cookies
            skip_auto_headers=("User-Agent", "Accept"),
            trust_env=False,  # backends are reached directly, never through a proxy
        )

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """POST `body` to `url`; the response once its head has arrived."""
        try:
            response = await self.session.post(
                url, data=body, headers=headers, allow_redirects=False
            )
        except aiohttp.ConnectionTimeoutError as exc:  # no connection: try another backend
            raise UpstreamUnreachable("ConnectTimeout") from exc
        except TimeoutError as exc:  # connected, then silent: aiohttp's are these
            raise UpstreamTimedOut("ReadTimeout") from exc
        except (aiohttp.ClientConnectorError, ConnectionError) as exc:  # refused, reset
            raise UpstreamUnreachable("ConnectError") from exc
        except ValueError as exc:  # aiohttp's InvalidURL too
            raise UpstreamUnreachable("InvalidURL") from exc
        except (aiohttp.ClientError, OSError) as exc:  # closed before its head, and the rest
            raise UpstreamUnreachable("ReadError") from exc
        return UpstreamResponse(response)

    async def aclose(self) -> None:
        """Close every connection."""
        await self.session.close()
