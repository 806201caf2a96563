"""The floor of a Python relay: the least an OpenAI-compatible proxy can do, on the gateway's
own stack (uvicorn + uvloop + httptools, a plain ASGI callable, aiohttp's `ClientSession`).

No keys, routing, limits, ledger, metrics, usage or error handling: it posts each request to
one upstream and streams the bytes back as they come. The benchmark's target `floor` (and
`floor-wN`, N uvicorn worker processes on one socket) runs it beside the gateway, so a run
shows how much of the gateway's cost is its own and how much any Python relay pays here.

Run: .venv/bin/python bench/floor_relay.py --upstream http://127.0.0.1:8001 --port 8002
         [--workers 2]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import aiohttp
import uvicorn

UPSTREAM = os.environ.get("FLOOR_UPSTREAM", "")
_session: aiohttp.ClientSession | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Relay `POST /v1/*` to the upstream; answer `GET /health`."""
    global _session
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        if _session is not None:
            await _session.close()
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    if _session is None:
        connector = aiohttp.TCPConnector(limit=0)
        _session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
    headers = {"content-type": "application/json"}
    async with _session.post(UPSTREAM + scope["path"], data=b"".join(chunks), headers=headers) as r:
        head = [(b"content-type", r.headers.get("content-type", "application/json").encode())]
        if "content-length" in r.headers:  # a whole response: relayed whole
            body = await r.read()
            head.append((b"content-length", b"%d" % len(body)))
            await send({"type": "http.response.start", "status": r.status, "headers": head})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": r.status, "headers": head})
        async for chunk in r.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    os.environ["FLOOR_UPSTREAM"] = args.upstream.rstrip("/")  # read again in each worker
    uvicorn.run(
        "floor_relay:app",
        app_dir=os.path.dirname(os.path.abspath(__file__)),
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
