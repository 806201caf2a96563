"""Probing vLLM servers: `GET /health` and `GET /v1/models`, never a paid completion."""

from __future__ import annotations

import enum

import httpx


class Probe(enum.Enum):
    """What one `GET /health` said."""

    HEALTHY = "healthy"
    DOWN = "down"  # refused, reset or answered other than 200: the server says so
    SLOW = "slow"  # no answer in time: a busy server looks the same as a dead one


async def probe_health(
    client: httpx.AsyncClient,
    base_url: str,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> Probe:
    """Ask the server at `base_url` for `GET /health` within `timeout_s`."""
    try:
        response = await client.get(f"{base_url}/health", timeout=timeout_s, headers=headers)
    except httpx.TimeoutException:
        return Probe.SLOW
    except httpx.HTTPError:
        return Probe.DOWN
    return Probe.HEALTHY if response.status_code == 200 else Probe.DOWN


async def probe_max_model_len(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> int | None:
    """The context length the server reports for `model` in `/v1/models` (vLLM's
    `max_model_len` on each model card): 0 when it answers without one, None when it does
    not answer (ask again later)."""
    try:
        response = await client.get(f"{base_url}/v1/models", timeout=timeout_s, headers=headers)
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if response.status_code != 200:
        return None
    for card in cards if isinstance(cards, list) else []:
        length = card.get("max_model_len") if isinstance(card, dict) else None
        if card.get("id") == model and isinstance(length, int) and length > 0:
            return length
    return 0


async def probe_version(
    client: httpx.AsyncClient,
    base_url: str,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> str | None:
    """The engine version the server's `/version` reports (vLLM serves `{"version": ...}`):
    "" when it answers without one (not vLLM, or too old), None when it does not answer."""
    try:
        response = await client.get(f"{base_url}/version", timeout=timeout_s, headers=headers)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if response.status_code >= 500:
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return version[:64] if isinstance(version, str) and version else ""
