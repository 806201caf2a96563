"""Probing vLLM servers: `GET /health` only, never a paid completion."""

from __future__ import annotations

import httpx


async def is_healthy(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> bool:
    """Whether the server at `base_url` answers `GET /health` with 200 in time."""
    try:
        response = await client.get(f"{base_url}/health", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return response.status_code == 200
