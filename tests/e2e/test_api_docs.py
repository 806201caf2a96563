"""The API's docs on a host cut off from the internet: a real gateway, and Debian's headless
Chromium that may reach nothing but loopback. `/docs` (Swagger UI) and `/redoc` render the
gateway's own API, with every asset served by the gateway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Route

from tests.browser import CHROMIUM, MISSING, chromium
from tests.e2e.conftest import ServerStarter, draftgate_env

RENDER_TIMEOUT_MS = 60_000  # a busy CI machine
ADMIN_TOKEN = "docs-admin-token"

if not CHROMIUM.exists():
    pytest.skip(MISSING, allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def _offline_page(browser: Browser, refused: list[str]) -> Page:
    """A page whose every request beyond loopback is refused (and listed in `refused`)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1800})

    def only_loopback(route: Route) -> None:
        if urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.set_default_timeout(RENDER_TIMEOUT_MS)
    return page


@pytest.mark.parametrize(
    ("path", "rendered"),
    [
        ("/docs", ".swagger-ui .opblock-tag"),  # the operations, grouped by tag
        ("/redoc", "[role=menuitem]"),  # ReDoc's side menu of operations
    ],
)
def test_docs_render_with_the_network_cut(
    start_server: ServerStarter, tmp_path: Path, browser: Browser, path: str, rendered: str
) -> None:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/docs.db", DRAFTGATE_ADMIN_TOKEN=ADMIN_TOKEN
    )
    server = start_server("gateway", env=env)
    refused: list[str] = []
    failed: list[str] = []
    page = _offline_page(browser, refused)
    page.on("requestfailed", lambda request: failed.append(request.url))
    try:
        page.goto(f"{server.base_url}{path}")
        page.locator(rendered).first.wait_for()
        text = page.locator("body").inner_text()
    finally:
        page.context.close()
    assert "draftgate" in text, text[:500]
    assert "/admin/v1/fleet" in text or "fleet" in text.lower(), text[:2000]
    assert refused == [], refused  # nothing asked beyond loopback
    assert failed == [], failed
