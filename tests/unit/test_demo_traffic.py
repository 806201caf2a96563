"""The demo load's shape: low, rising to high at half a period, low again."""

from __future__ import annotations

import pytest

from gateway.cli.demo_traffic import DemoLoad

LOAD = DemoLoad("m", low=1, high=24, period_s=120.0)


@pytest.mark.parametrize(
    ("elapsed_s", "clients"),
    [(0.0, 1), (20.0, 7), (40.0, 18), (60.0, 24), (80.0, 18), (100.0, 7), (120.0, 1), (180.0, 24)],
)
def test_clients_rise_and_fall_over_a_period(elapsed_s: float, clients: int) -> None:
    # 1 + round((1 - cos(2 pi t / 120)) / 2 * 23): at 20 s, 1 + round(0.25 * 23) = 7.
    assert LOAD.clients_at(elapsed_s) == clients
