"""The dashboard: `streamlit run dashboard/streamlit_app.py` (or `draftgate dashboard`)."""

from __future__ import annotations

import streamlit as st

from dashboard.app_pages import methods, overview


def main() -> None:
    """Lay out the pages and run the one chosen."""
    st.set_page_config(page_title="draftgate", layout="wide")
    pages = [
        st.Page(overview.render, title="Overview", url_path="overview", default=True),
        st.Page(methods.render, title="Methods", url_path="methods"),
    ]
    st.navigation(pages).run()


main()
