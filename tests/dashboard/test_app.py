"""The whole app: navigation, every page without a traceback, errors as messages, no token."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import dashboard
from dashboard.app_pages import accuracy, backends, benchmarks, keys, methods, overview, planner
from dashboard.client import READ_ONLY_NOTE
from tests.dashboard.conftest import Stack
from tests.e2e.conftest import ADMIN_TOKEN, READ_TOKEN, closed_url

APP = Path(dashboard.__file__).parent / "streamlit_app.py"
TIMEOUT_S = 30.0
PAGES = [overview, methods, planner, backends, benchmarks, keys, accuracy]


def _page(module_name: str) -> None:
    import importlib

    importlib.import_module(f"dashboard.app_pages.{module_name}").render()  # type: ignore[attr-defined]


def test_the_app_opens_on_the_overview_with_every_page_in_the_navigation(
    dashboard_env: Stack,
) -> None:
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert at.title[0].value == "Overview"


@pytest.mark.parametrize("page", PAGES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_no_page_shows_the_admin_token(dashboard_env: Stack, page: object) -> None:
    name = page.__name__.rsplit(".", 1)[1]  # type: ignore[attr-defined]
    at = AppTest.from_function(_page, args=(name,), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value
    assert ADMIN_TOKEN not in repr(at.main) + repr(at.sidebar)


def _overview_error(monkeypatch: pytest.MonkeyPatch, **env: str | None) -> str:
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    at = AppTest.from_function(_page, args=("overview",), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    return str(at.error[0].value)


def test_an_unreachable_gateway_is_a_message_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = closed_url()
    message = _overview_error(
        monkeypatch, DRAFTGATE_DASHBOARD_GATEWAY_URL=url, DRAFTGATE_ADMIN_READ_TOKEN=READ_TOKEN
    )
    assert message.startswith(f"cannot reach the gateway at {url}")


def test_a_wrong_token_shows_the_admin_api_refusal(
    dashboard_env: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _overview_error(monkeypatch, DRAFTGATE_ADMIN_TOKEN="not-the-admin-token-0123")
    assert message.startswith("the admin API answered 401")


def test_a_missing_token_says_how_to_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _overview_error(
        monkeypatch, DRAFTGATE_ADMIN_READ_TOKEN=None, DRAFTGATE_ADMIN_TOKEN=ADMIN_TOKEN
    )
    assert "set DRAFTGATE_ADMIN_READ_TOKEN" in message  # the admin token is not used unasked
    message = _overview_error(
        monkeypatch, DRAFTGATE_DASHBOARD_ADMIN="true", DRAFTGATE_ADMIN_TOKEN=None
    )
    assert "DRAFTGATE_ADMIN_TOKEN is not set" in message


FORMS = {
    "backends": ["add-save", "change-toggle", "change-remove"],
    "benchmarks": ["bench-start"],
    "keys": ["key-create", "revoke"],
    "methods": ["policy-save"],
    "prices": ["price-save", "price-remove-button"],
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_with_the_read_token_no_page_offers_a_change(read_only_env: Stack, name: str) -> None:
    at = AppTest.from_function(_page, args=(name,), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    shown = {b.key for b in at.button} | {b.key for b in at.get("form_submit_button")}
    assert not shown & set(FORMS[name]), shown
    assert any(READ_ONLY_NOTE in c.value for c in at.caption)
    assert READ_TOKEN not in repr(at.main) + repr(at.sidebar)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_with_the_admin_token_each_page_offers_its_changes(dashboard_env: Stack, name: str) -> None:
    """The other side of the test above: the same pages, acting as admin, show the forms."""
    at = AppTest.from_function(_page, args=(name,), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    shown = {b.key for b in at.button} | {b.key for b in at.get("form_submit_button")}
    assert shown & set(FORMS[name]), shown
