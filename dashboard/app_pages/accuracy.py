"""Accuracy: every measured point beside the planner's prediction from the others."""

from __future__ import annotations

import streamlit as st

from dashboard import charts
from dashboard.client import admin_client, shows_api_errors
from dashboard.formats import NO_DATA, count


@shows_api_errors
def render() -> None:
    """The Accuracy page."""
    st.title("Accuracy")
    accuracy = admin_client().accuracy()
    if not accuracy.points:
        st.info(
            "No measurements yet. The collector stores one per backend as traffic flows; "
            "a sweep on the Benchmarks page adds more."
        )
        return
    mean = accuracy.mean_absolute_error
    st.metric("Mean absolute error (held out)", NO_DATA if mean is None else f"{mean:.1%}")
    if mean is None:
        st.caption(
            "No error yet: a point is predicted from the other measurements of its "
            "model and GPU once there are enough of them; more arrive as traffic flows "
            "and sweeps finish."
        )
    if accuracy.predicted:
        left, right = st.columns(2)
        left.altair_chart(charts.predicted_vs_measured(accuracy.points))
        right.altair_chart(charts.running_error(accuracy.points))
    st.dataframe(
        [
            {
                "model": p.model,
                "GPU": p.gpu_type,
                "method": p.method,
                "K": p.k,
                "concurrency": round(p.concurrency, 2),
                "source": p.source,
                "measured tokens/s per GPU": count(p.measured_output_tokens_per_s),
                "predicted": None
                if p.predicted_output_tokens_per_s is None
                else round(p.predicted_output_tokens_per_s, 1),
                "error": None if p.error is None else f"{p.error:+.1%}",
            }
            for p in accuracy.points
        ],
        hide_index=True,
    )
    st.caption(
        f"{accuracy.predicted} of {len(accuracy.points)} measured points predicted "
        "from the other measurements of their model and GPU."
    )
