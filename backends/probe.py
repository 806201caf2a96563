"""Probing vLLM servers: `GET /health` only, never a paid completion."""

from __future__ import annotations

import enum

import httpx


class Probe(enum.Enum):
    """What one `GET /health` said."""

    HEALTHY = "healthy"
    DOWN = "down"  # refused, reset or answered other than 200: the server says so
    SLOW = "slow"  # no answer in time: a busy server looks the same as a dead one


async def probe_health(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> Probe:
    """Ask the server at `base_url` for `GET /health` within `timeout_s`."""
    try:
        response = await client.get(f"{base_url}/health", timeout=timeout_s)
    except httpx.TimeoutException:
        return Probe.SLOW
    except httpx.HTTPError:
        return Probe.DOWN
    return Probe.HEALTHY if response.status_code == 200 else Probe.DOWN
