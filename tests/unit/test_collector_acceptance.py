"""The collector keeps each backend's live acceptance for the admin API's runtime view and
`draftgate_backend_acceptance_length`."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from sqlalchemy.orm import sessionmaker

from backends.vllm_metrics import VllmSnapshot
from gateway.control.collector import Collector
from gateway.control.windows import Gate
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, InFlightClock, Registry
from tests.unit.test_collector import AFTER, BEFORE, PEAGLE, PLAIN


def _collector() -> Collector:
    registry = Registry(sessionmaker(), refresh_s=60.0)
    return Collector(
        registry,
        httpx.AsyncClient(),
        sessionmaker(),
        GatewayMetrics(),
        interval_s=1.0,
        window_s=10.0,
        gate=Gate(min_requests=1, min_output_tokens=1),
    )


def _absorb(collector: Collector, backend: BackendView, *pages: VllmSnapshot) -> None:
    for i, page in enumerate(pages):
        collector._absorb(backend, page, 2.0 * i, InFlightClock())


def test_the_last_drafting_interval_is_the_live_acceptance() -> None:
    collector = _collector()
    state = collector.registry.states[PEAGLE.name]
    _absorb(collector, PEAGLE, BEFORE)
    assert state.acceptance_length is None  # one page: no interval yet
    _absorb(collector, PEAGLE, BEFORE, AFTER)
    assert state.acceptance_length == 4.0  # 1 + 600 accepted / 200 drafts
    assert state.acceptance_per_position == pytest.approx((0.95, 0.8, 0.6, 0.375, 0.2, 0.075, 0))
    idle = replace(AFTER)  # no new drafts: the last known acceptance stays
    collector._absorb(PEAGLE, idle, 10.0, InFlightClock())
    assert state.acceptance_length == 4.0
    assert _gauge(collector, PEAGLE) == 4.0


def test_plain_pages_carry_no_acceptance() -> None:
    collector = _collector()
    plain_page = replace(
        AFTER, drafts=None, draft_tokens=None, accepted_tokens=None, accepted_per_position=None
    )
    _absorb(
        collector,
        PLAIN,
        replace(
            BEFORE, drafts=None, draft_tokens=None, accepted_tokens=None, accepted_per_position=None
        ),
        plain_page,
    )
    state = collector.registry.states[PLAIN.name]
    assert state.acceptance_length is None
    assert state.acceptance_per_position is None
    assert _gauge(collector, PLAIN) is None


def test_a_backend_that_stops_drafting_loses_its_gauge() -> None:
    """A backend restarted without speculation (its method now contradicted) is not left
    showing its old acceptance."""
    collector = _collector()
    _absorb(collector, PEAGLE, BEFORE, AFTER)
    assert _gauge(collector, PEAGLE) == 4.0
    no_drafts = replace(
        AFTER, drafts=None, draft_tokens=None, accepted_tokens=None, accepted_per_position=None
    )
    collector._absorb(PEAGLE, no_drafts, 10.0, InFlightClock())
    assert _gauge(collector, PEAGLE) is None


def _gauge(collector: Collector, backend: BackendView) -> float | None:
    return collector.metrics.registry.get_sample_value(
        "draftgate_backend_acceptance_length", {"backend": backend.name, "pool": backend.pool}
    )
