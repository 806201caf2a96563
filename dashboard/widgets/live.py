"""Live panels: redrawn on their own every few seconds, with a switch to pause them."""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard.client import CACHE_TTL_S, Page, shows_api_errors

REFRESH_S = CACHE_TTL_S  # a redraw reads afresh: the cached reads expire as often


def _stamped(render: Page, paused: bool) -> Page:
    def panel() -> None:
        shows_api_errors(render)()
        now = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        every = "auto-refresh paused" if paused else f"refreshes every {REFRESH_S:g} s"
        st.caption(f"updated {now} UTC ({every})")

    return panel


def live_panel(render: Page, key: str) -> None:
    """Draw `render` as a panel redrawn every REFRESH_S, unless its pause switch is on.

    The switch sits outside the panel: turning it reruns the page, which redraws the panel
    with or without its timer.
    """
    paused = st.toggle("Pause auto-refresh", key=f"{key}-pause")
    st.fragment(_stamped(render, paused), run_every=None if paused else REFRESH_S)()
