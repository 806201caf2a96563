"""The curves that price requests, as both the Methods and the Planner pages draw them."""

from __future__ import annotations

import streamlit as st

from dashboard import charts
from dashboard.client import AdminClient
from dashboard.formats import NO_DATA
from dashboard.schemas import Curve, CurveLinePoint


def live_curves(api: AdminClient, model: str, gpu: str | None = None) -> None:
    """The curves that price this model's requests, drive `auto` and size its fleet."""
    st.subheader("The curves that price requests now")
    curves = [c for c in api.curves(model).curves if gpu is None or c.gpu_type == gpu]
    if not curves:
        where = f" on {gpu}" if gpu else ""
        st.info(f"No curve{where} yet: one appears once a backend of this model runs there.")
        return
    for gpu_type in sorted({c.gpu_type for c in curves}):
        mine = [c for c in curves if c.gpu_type == gpu_type]
        st.altair_chart(charts.live_curves(mine))
        st.caption(
            f"{gpu_type}: each method's line as the gateway prices requests with it (GET "
            "/admin/v1/curves), filled points measured, hollow ones estimated by the planner; "
            "the shaded band is the 95% interval."
        )
        st.dataframe([_line_row(c, p) for c in mine for p in c.line], hide_index=True)


def _line_row(curve: Curve, point: CurveLinePoint) -> dict[str, object]:
    usd, band = point.usd_per_mtok, point.usd_per_mtok_95
    return {
        "method": curve.method,
        "K": curve.k,
        "concurrency": point.concurrency,
        "tokens/s per GPU": f"{point.output_tokens_per_s:,.0f}",
        "$ per 1M output tokens": "no price" if usd is None else f"${usd:,.4f}",
        "95% interval": NO_DATA if band is None else f"${band[0]:,.4f} to ${band[1]:,.4f}",
        "source": point.source,
    }
