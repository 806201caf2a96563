"""Health probes: what one answer means, and when a backend is taken out."""

from __future__ import annotations

import httpx
import pytest

from backends.probe import Probe, probe_health
from gateway.control.prober import SLOW_PROBES_DOWN, apply_probe
from gateway.registry import BackendState


def _raise(exc: Exception) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("transport", "expected"),
    [
        (httpx.MockTransport(lambda r: httpx.Response(200, json={})), Probe.HEALTHY),
        (httpx.MockTransport(lambda r: httpx.Response(503)), Probe.DOWN),
        (_raise(httpx.ConnectError("refused")), Probe.DOWN),
        (_raise(httpx.RemoteProtocolError("reset")), Probe.DOWN),
        (_raise(httpx.ReadTimeout("slow")), Probe.SLOW),
        (_raise(httpx.ConnectTimeout("slow")), Probe.SLOW),
    ],
)
async def test_one_probe_says_healthy_down_or_slow(
    transport: httpx.MockTransport, expected: Probe
) -> None:
    async with httpx.AsyncClient(transport=transport) as client:
        assert await probe_health(client, "http://backend", timeout_s=1.0) is expected


def _after(*results: Probe) -> BackendState:
    state = BackendState()
    for result in results:
        apply_probe(state, result)
    return state


def test_a_refusal_takes_a_backend_out_at_once_and_an_answer_brings_it_back() -> None:
    assert not _after(Probe.DOWN).healthy
    assert _after(Probe.DOWN, Probe.HEALTHY).healthy


def test_a_busy_backend_stays_in_until_it_is_slow_several_times_running() -> None:
    assert SLOW_PROBES_DOWN == 2
    assert _after(Probe.SLOW).healthy
    assert _after(Probe.SLOW, Probe.HEALTHY, Probe.SLOW).healthy
    assert not _after(Probe.SLOW, Probe.SLOW).healthy
    assert not _after(Probe.SLOW, Probe.SLOW, Probe.SLOW).healthy
    assert _after(Probe.SLOW, Probe.SLOW, Probe.HEALTHY).healthy
    assert not _after(Probe.SLOW, Probe.DOWN).healthy
