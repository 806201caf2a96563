"""Debian's headless Chromium, driven by Playwright's Python package (never its own browser
download; `make test` installs the package): what the browser tests share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
MISSING = "no /usr/bin/chromium (make test installs it)"


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium for the block's life."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
