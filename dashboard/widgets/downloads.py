"""The usage records behind a page's figures, as the admin API's CSV, downloaded on click."""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard.client import AdminClient


def usage_csv_button(
    api: AdminClient, start: dt.datetime, label: str, key: int | None = None, widget: str = ""
) -> None:
    """A button that downloads every usage record since `start` (of one API key): each
    request with the concurrency, $/1M and curve that priced it, to recompute any figure."""
    st.download_button(
        f"Download the usage records ({label}, CSV)",
        data=lambda: api.usage_csv(start, key),
        file_name="usage.csv" if key is None else f"usage-key-{key}.csv",
        mime="text/csv",
        on_click="ignore",
        key=widget or f"usage-csv-{key}",
        help="GET /admin/v1/usage?format=csv: one row per request, with its price applied.",
    )
