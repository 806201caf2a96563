"""A real browser (Debian's headless Chromium) on the dashboard of `draftgate up`.

It opens every page, saves a screenshot of each under test-artefacts/dashboard/, pins a
method on the Methods page, confirmed through the admin API, follows deep links, and makes
the Backends and Keys pages' changes one by one: after each, the page shows it at once and
every page renders with no error, no raw Python value and no "Page not found".
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser import CHROMIUM, MISSING, chromium
from tests.dashboard.conftest import MODEL, Stack
from tests.e2e.conftest import closed_url

ARTEFACTS = Path(__file__).resolve().parents[2] / "test-artefacts" / "dashboard"
# Each page's title and a text drawn at its end: the run is over once both show.
PAGES = {
    "": ("Overview", "per UTC day"),  # the default page is served at the root
    "methods": ("Methods", "Traffic by method, last hour"),
    "planner": ("Planner / what-if", "Deploy "),
    "backends": ("Backends", "Add backend"),
    "benchmarks": ("Benchmarks", "Stored measurements"),
    "keys": ("Teams and keys", "Create key"),
    "prices": ("Prices", "Set a price"),
    "accuracy": ("Accuracy", "predicted from the other measurements"),
}
RENDER_TIMEOUT_MS = 60_000  # generous: CI machines are busy
UPDATED = re.compile(r"^updated \d\d:\d\d:\d\d UTC")  # a live panel's stamp
LIVE_REFRESH_MS = 5_000
OPTION_TIMEOUT_MS = 5_000
OPEN_ATTEMPTS = 4
TWO_MINUTES_S = 120.0  # the newcomer looks at the Overview two minutes in
SETTLED = """() => !document.querySelector('[data-testid="stSkeleton"]')
    && !document.querySelector('[data-testid="stStatusWidget"]')"""
# What a table cell must never show: a Python dict or list, or None, printed as is.
RAW = re.compile(r"\{'|\{\"|\['|\bNone\b")
CELLS = '[data-testid="stDataFrame"] table td'
# Text cut off where it is drawn: an element (metrics, captions, text, headings, buttons, and
# what they hold) whose content is wider than its box. Tables are drawn on a canvas: not here.
TEXT = ", ".join(
    f'[data-testid="{t}"], [data-testid="{t}"] *'
    for t in ("stMetricLabel", "stMetricValue", "stMetricDelta", "stCaptionContainer",
              "stMarkdownContainer", "stHeading", "stButton")
)  # fmt: skip
CLIPPED = """(selector) => [...document.querySelectorAll(selector)]
    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1
                 && getComputedStyle(e).overflowX !== 'visible')
    .map(e => e.innerText.slice(0, 100))"""

if not CHROMIUM.exists():
    pytest.skip(MISSING, allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 2400})
    try:
        page = context.new_page()
        page.set_default_timeout(RENDER_TIMEOUT_MS)
        yield page
    finally:
        context.close()


def _open(page: Page, stack: Stack, path: str, query: str = "") -> None:
    page.goto(f"{stack.dashboard_url}/{path}{query}")
    title, last = PAGES[path]
    page.get_by_role("heading", name=title, exact=True).wait_for(timeout=RENDER_TIMEOUT_MS)
    page.get_by_text(last).first.wait_for(timeout=RENDER_TIMEOUT_MS)
    # Widgets, tables and charts load their code lazily: a skeleton stands in until then.
    page.wait_for_function(SETTLED, timeout=RENDER_TIMEOUT_MS)


def _choose(page: Page, label: str, option: str) -> None:
    """Pick `option` in a select box; a list that closed again (a redraw) is reopened."""
    for _ in range(OPEN_ATTEMPTS):
        page.get_by_role("combobox", name=label, exact=True).click()
        try:
            page.get_by_role("option", name=option, exact=True).click(timeout=OPTION_TIMEOUT_MS)
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    pytest.fail(f"no option {option!r} in {label!r} after {OPEN_ATTEMPTS} tries")


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_in_the_browser(page: Page, stack: Stack, path: str) -> None:
    _open(page, stack, path)
    assert page.get_by_test_id("stException").count() == 0
    assert page.get_by_test_id("stAlertContentError").count() == 0
    assert page.get_by_role("button", name="Deploy").count() == 0  # a viewer's toolbar
    assert page.evaluate(CLIPPED, TEXT) == [], "text cut off where it is drawn"
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    index = list(PAGES).index(path) + 1
    page.screenshot(path=str(ARTEFACTS / f"{index:02d}-{path or 'overview'}.png"))


def test_the_overview_leads_with_a_verdict_that_adds_up(page: Page, stack: Stack) -> None:
    _open(page, stack, "")
    page.get_by_text(re.compile(r"^Bill \$")).first.wait_for()
    # One read of the whole page: the live panel redraws every few seconds, and the bill
    # grows with every second the GPUs are held.
    text = page.locator("body").inner_text()
    sentence = re.search(r"You paid \$.*", text).group(0)  # type: ignore[union-attr]
    split = re.search(r"Bill \$.*", text).group(0)  # type: ignore[union-attr]
    action = re.search(r"(Release|Set a latency objective|Move to|Nothing to do).*", text)
    assert action is not None, text[:3000]
    bill, best, mix, over = (
        float(sign + digits.replace(",", ""))
        for sign, digits in re.findall(r"(-?)\$([\d,]+\.\d\d)\b", split)
    )
    assert round(best + mix + over, 2) == bill, split
    assert f"${bill:,.2f}" in sentence, (sentence, split)


def test_pinning_a_method_on_the_methods_page_changes_the_policy(page: Page, stack: Stack) -> None:
    _open(page, stack, "methods")
    page.get_by_text("pinned", exact=True).click()
    _choose(page, "Pinned method", "eagle3")
    page.get_by_label("Pinned K (0: the backend's own)").fill("3")
    page.get_by_label("Per-token latency objective, ms (0: none)").fill("45")
    page.get_by_role("button", name="Save policy").click()
    saved = page.get_by_text("set to pinned to eagle3 K=3, per-token ≤ 45 ms")
    saved.wait_for(timeout=RENDER_TIMEOUT_MS)
    page.screenshot(path=str(ARTEFACTS / "08-methods-policy-pinned.png"))
    with stack.admin() as admin:
        policy = admin.get(f"/admin/v1/models/{MODEL}/policy").json()
        admin.put(f"/admin/v1/models/{MODEL}/policy", json={"mode": "auto"})
    assert policy["mode"] == "pinned"
    assert policy["method"] == "eagle3"
    assert policy["k"] == 3
    assert policy["itl_objective_ms"] == 45.0


def _updated(page: Page) -> str:
    text: str = page.get_by_text(UPDATED).first.inner_text()
    return text


def test_live_panels_refresh_on_their_own_and_pause(page: Page, stack: Stack) -> None:
    _open(page, stack, "backends")
    first = _updated(page)
    assert "refreshes every" in first
    # No click, no reload: the panel redraws itself with a newer time.
    page.wait_for_function(
        """(first) => [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
            .some(e => e.innerText.startsWith('updated ') && e.innerText !== first)""",
        arg=first,
        timeout=RENDER_TIMEOUT_MS,
    )
    assert page.get_by_text("acceptance length").count() >= 1  # the live table's column
    page.get_by_text("Pause auto-refresh").click()
    page.get_by_text("auto-refresh paused").wait_for(timeout=RENDER_TIMEOUT_MS)
    paused = _updated(page)
    page.wait_for_timeout(3 * LIVE_REFRESH_MS)  # a running timer would have redrawn by now
    assert _updated(page) == paused
    page.screenshot(path=str(ARTEFACTS / "09-backends-live-paused.png"))


def _cells(page: Page) -> list[str]:
    """The text of every table cell drawn (tables keep an accessible copy in the page)."""
    return page.locator(CELLS).all_inner_texts()


def _clean(page: Page, where: str) -> None:
    assert page.get_by_text("Page not found").count() == 0, where
    assert page.get_by_test_id("stException").count() == 0, where
    assert page.get_by_test_id("stAlertContentError").count() == 0, where
    raw = [cell for cell in _cells(page) if RAW.search(cell)]
    assert not raw, (where, raw)


def _walk(page: Page, stack: Stack, after: str) -> None:
    """Every page, clean, with a screenshot, after the change `after`."""
    for index, path in enumerate(PAGES, start=1):
        _open(page, stack, path)
        _clean(page, f"{path or 'overview'} after {after}")
        shot = ARTEFACTS / f"walk-{after}-{index:02d}-{path or 'overview'}.png"
        page.screenshot(path=str(shot))


def _shows(page: Page, text: str) -> None:
    """Wait until a table cell reads `text` (the page's rerun after a change)."""
    cell = page.locator(CELLS, has_text=re.compile(f"^{re.escape(text)}$")).first
    cell.wait_for(state="attached")  # the accessible copy is in the page, not shown


def test_deep_links_open_their_page(page: Page, stack: Stack) -> None:
    _open(page, stack, "", "overview")  # the default page by its own name
    assert page.url.rstrip("/") == stack.dashboard_url
    _clean(page, "/overview")
    other = {"name": "link-other", "url": closed_url(), "model": "acme/other", "method": "plain"}
    with stack.admin() as admin:  # a model listed before the demo's: the link must pick
        assert admin.post("/admin/v1/backends", json=other).status_code == 201
    try:
        _open(page, stack, "methods", f"?model={MODEL}")
        assert page.get_by_label("Model", exact=True).input_value() == MODEL
        _clean(page, "/methods?model=")
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTEFACTS / "10-methods-deep-link.png"))
    finally:
        with stack.admin() as admin:
            assert admin.delete("/admin/v1/backends/link-other").status_code == 204
            assert admin.delete("/admin/v1/models/acme/other").status_code == 204


def test_each_change_shows_at_once_and_every_page_stays_clean(page: Page, stack: Stack) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    name = "walk-extra"
    _open(page, stack, "backends")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Base URL (without /v1)").fill(closed_url())
    page.get_by_label("Model", exact=True).fill(MODEL)
    page.get_by_role("button", name="Add backend").click()
    page.get_by_text(f"Added {name} (plain) for {MODEL}").wait_for()
    _shows(page, name)  # in the table above the form, without a reload
    _walk(page, stack, "add-backend")

    _open(page, stack, "backends")
    _choose(page, "Backend", name)
    page.get_by_role("button", name=f"Disable {name}").click()
    page.get_by_text(f"{name} is now disabled").wait_for()
    _shows(page, "disabled")
    page.get_by_role("button", name=f"Enable {name}").wait_for()
    _walk(page, stack, "disable-backend")

    _open(page, stack, "backends")
    _choose(page, "Backend", name)
    page.get_by_text(f"Yes, remove {name}").click()
    page.get_by_role("button", name="Remove", exact=True).click()
    page.get_by_text(f"Removed {name}").wait_for()
    page.wait_for_function(SETTLED)
    assert name not in _cells(page)
    with stack.admin() as admin:
        assert admin.get(f"/admin/v1/backends/{name}").status_code == 404
    _walk(page, stack, "remove-backend")

    _open(page, stack, "keys")
    page.get_by_label("Name", exact=True).fill("walk-key")
    page.get_by_role("button", name="Create key").click()
    page.get_by_text("Copy it now: it is shown only once.").wait_for()
    _shows(page, "walk-key")
    secret = page.get_by_test_id("stCode").first.inner_text().strip()
    with stack.admin() as admin:
        keys = admin.get("/admin/v1/keys").json()["data"]
    [key] = [k for k in keys if k["name"] == "walk-key"]
    assert secret.startswith(key["key_prefix"])
    page.screenshot(path=str(ARTEFACTS / "11-keys-created.png"))
    _walk(page, stack, "create-key")

    _open(page, stack, "keys")
    _choose(page, "Key", f"{key['id']}: walk-key ({key['key_prefix']}…)")
    page.get_by_role("button", name="Revoke", exact=True).click()
    page.get_by_text(f"Revoked key {key['id']}").wait_for()
    page.wait_for_function(SETTLED)
    assert "walk-key" not in _cells(page)  # revoked keys are hidden,
    page.get_by_text("Show revoked keys").click()  # unless asked for
    _shows(page, "walk-key")
    page.screenshot(path=str(ARTEFACTS / "12-keys-revoked-shown.png"))
    _walk(page, stack, "revoke-key")


def test_the_overview_two_minutes_in_adds_up_and_says_what_to_do(page: Page, stack: Stack) -> None:
    """The newcomer's look: the Overview of a stack two minutes old (the tests above ran in
    them; what is left is waited for), read once: its sentence and action, a bill that adds
    up to the cent, and GPUs to release that are the pools' held less their wanted GPUs
    by the admin API. Drawn last, after the walk's changes."""
    page.wait_for_timeout(max(0.0, TWO_MINUTES_S - (time.monotonic() - stack.started)) * 1000)
    _open(page, stack, "")
    page.get_by_text(re.compile(r"^Bill \$")).first.wait_for()
    metric = page.get_by_test_id("stMetric").filter(has_text="GPUs you could release now")
    for _ in range(OPEN_ATTEMPTS):  # the API's view and the page's, of one selector round
        before = _release_by_api(stack)
        text = page.locator("body").inner_text()
        shown = metric.get_by_test_id("stMetricValue").inner_text().strip()
        if before == _release_by_api(stack):
            break
    assert re.search(r"You paid \$", text), text[:3000]
    assert re.search(r"(Release|Set a latency objective|Move to|Nothing to do)", text), text[:3000]
    split = re.search(r"Bill \$.*", text).group(0)  # type: ignore[union-attr]
    bill, best, mix, over = (
        float(sign + digits.replace(",", ""))
        for sign, digits in re.findall(r"(-?)\$([\d,]+\.\d\d)\b", split)
    )
    assert round(best + mix + over, 2) == bill, split
    assert shown == (f"{before:,}" if before >= 0 else f"add {-before:,}"), (shown, before)
    assert page.evaluate(CLIPPED, TEXT) == [], "text cut off where it is drawn"
    page.screenshot(path=str(ARTEFACTS / "13-overview-two-minutes-in.png"))


def _release_by_api(stack: Stack) -> int:
    """GPUs the model's pools hold less the GPUs its load wants now, by the admin API."""
    with stack.admin() as admin:
        backends = admin.get("/admin/v1/backends").json()["data"]
        fleet = admin.get("/admin/v1/fleet", params={"model": MODEL}).json()
    held = sum(b["gpu_count"] for b in backends if b["model"] == MODEL and b["enabled"])
    per_replica = {m["method"]: m["gpu_count"] for m in fleet["methods"]}
    wanted = sum(n * per_replica.get(m, 1) for m, n in fleet["now"]["desired_replicas"].items())
    return held - wanted
