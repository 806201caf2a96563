"""The dashboard's settings and periods: documented, read from the environment, token hidden."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from dashboard.settings import DashboardSettings
from dashboard.widgets.periods import period_start

SETTINGS_DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


@pytest.mark.parametrize("name", sorted(DashboardSettings.model_fields))
def test_every_field_is_documented_here_and_in_the_settings_reference(name: str) -> None:
    description = DashboardSettings.model_fields[name].description
    assert description is not None
    assert "default" in description.lower(), name
    assert f"`DRAFTGATE_{name.upper()}`" in SETTINGS_DOC.read_text(encoding="utf-8")


def test_reads_the_environment_and_never_shows_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGATE_DASHBOARD_GATEWAY_URL", "http://127.0.0.1:9999")
    monkeypatch.setenv("DRAFTGATE_ADMIN_TOKEN", "a-dashboard-token-0123456789")
    settings = DashboardSettings()
    assert settings.dashboard_gateway_url == "http://127.0.0.1:9999"
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "a-dashboard-token-0123456789"
    assert "a-dashboard-token" not in repr(settings)


NOW = dt.datetime(2026, 11, 29, 13, 45, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("label", "start"),
    [
        ("today", dt.datetime(2026, 11, 29, tzinfo=dt.UTC)),
        ("7 days", dt.datetime(2026, 11, 22, tzinfo=dt.UTC)),
        ("30 days", dt.datetime(2026, 10, 30, tzinfo=dt.UTC)),
    ],
)
def test_periods_start_at_midnight_utc(label: str, start: dt.datetime) -> None:
    assert period_start(label, NOW) == start
