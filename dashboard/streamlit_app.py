"""The dashboard: `streamlit run dashboard/streamlit_app.py` (or `draftgate dashboard`)."""

from __future__ import annotations

import streamlit as st

from dashboard.app_pages import (
    accuracy,
    backends,
    benchmarks,
    keys,
    methods,
    overview,
    planner,
    prices,
)


def main() -> None:
    """Lay out the pages and run the one chosen."""
    st.set_page_config(page_title="draftgate", layout="wide")
    pages = [
        st.Page(overview.render, title="Overview", url_path="overview", default=True),
        st.Page(methods.render, title="Methods", url_path="methods"),
        st.Page(planner.render, title="Planner / what-if", url_path="planner"),
        st.Page(backends.render, title="Backends", url_path="backends"),
        st.Page(benchmarks.render, title="Benchmarks", url_path="benchmarks"),
        st.Page(keys.render, title="Teams and keys", url_path="keys"),
        st.Page(prices.render, title="Prices", url_path="prices"),
        st.Page(accuracy.render, title="Accuracy", url_path="accuracy"),
    ]
    st.navigation(pages).run()


main()
