"""Benchmarks: start a load sweep against a backend, follow it, read its results."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard.client import (
    AdminClient,
    admin_client,
    offers_changes,
    refresh_reads,
    shows_api_errors,
)
from dashboard.formats import NO_DATA, count, ms, or_missing
from dashboard.schemas import Backend, Benchmark
from dashboard.widgets.flash import changed, show_flash
from dashboard.widgets.live import live_panel

LATEST = 20  # measurements listed
SOURCES = {"scrape": "live traffic (collector)", "bench": "sweep", "import": "imported"}
LEVEL_COLUMNS = {
    "concurrency": "concurrency",
    "completed": "completed",
    "failed": "failed",
    "output_tokens_per_s": "output tokens/s",
    "mean_ttft_ms": "TTFT (ms)",
    "mean_tpot_ms": "per-token latency (ms)",
    "mean_itl_ms": "inter-chunk latency (ms)",
    "acceptance_length": "acceptance length",
}


def _levels(run: Benchmark) -> list[dict[str, Any]]:
    levels = (run.result or {}).get("levels", [])
    return [{label: level.get(key) for key, label in LEVEL_COLUMNS.items()} for level in levels]


def _start_form(api: AdminClient, backends: list[Backend]) -> None:
    with st.form("start-benchmark"):
        name = st.selectbox("Backend", [b.name for b in backends], key="bench-backend")
        levels = st.text_input("Concurrency levels", "1,4,16", key="bench-levels")
        requests = st.number_input("Requests per level", 1, 100_000, 20, key="bench-requests")
        if not st.form_submit_button("Start sweep", key="bench-start"):
            return
    try:
        concurrency = [int(level) for level in levels.split(",") if level.strip()]
    except ValueError:
        st.error(f"Concurrency levels are whole numbers separated by commas, not {levels!r}")
        return
    run = api.start_benchmark(name, concurrency, int(requests))
    changed(f"Started benchmark {run.id} against {name}: levels {concurrency}")


def _run(run: Benchmark) -> None:
    """One sweep: status, progress, and its levels once they are measured."""
    title = f"#{run.id} {run.backend_name or run.model}: {run.status}"
    with st.expander(title, expanded=run.status in {"queued", "running"}):
        st.progress(min(max(run.progress, 0.0), 1.0), text=f"{run.progress:.0%}")
        if run.error:
            st.error(run.error)
        levels = _levels(run)
        if levels:
            st.dataframe(levels, hide_index=True)


@shows_api_errors
def render() -> None:
    """The Benchmarks page."""
    st.title("Benchmarks")
    show_flash()
    api = admin_client()
    backends = api.backends()
    if not backends:
        st.info("No backends to benchmark yet: add one on the Backends page.")
        return
    if offers_changes(api):
        _start_form(api, backends)
    st.subheader("Runs")
    st.button("Refresh now", key="bench-refresh", on_click=refresh_reads)
    live_panel(_runs, "bench-live")
    _measurements(api)


def _measurements(api: AdminClient) -> None:
    """The measurements the planner fits to: sweeps' levels beside the collector's windows."""
    st.subheader("Stored measurements")
    latest = api.measurements(limit=LATEST)
    if not latest:
        st.info(
            "No measurements yet: the collector stores one per backend as traffic flows, "
            "and each finished sweep level is stored too."
        )
        return
    st.caption(
        f"The latest {len(latest)}, newest first. Each finished sweep level is stored as "
        "one, and the collector stores one per backend and window of live traffic; the "
        "planner fits to them all."
    )
    st.dataframe(
        [
            {
                "at": m.measured_at,
                "backend": m.backend_name,
                "model": m.model,
                "GPU": f"{m.gpu_count} x {m.gpu_type}",
                "method": m.method,
                "K": or_missing(m.k),
                "concurrency": round(m.concurrency, 2),
                "output tokens/s": count(m.output_tokens_per_s),
                "acceptance length": NO_DATA
                if m.mean_acceptance_length is None
                else f"{m.mean_acceptance_length:.2f}",
                "inter-chunk latency": ms(m.itl_ms),
                "source": SOURCES.get(m.source, m.source),
            }
            for m in latest
        ],
        hide_index=True,
    )


def _runs() -> None:
    """Every run, newest first (a live panel: progress moves while the page is open)."""
    runs = sorted(admin_client().benchmarks(), key=lambda r: r.id, reverse=True)
    if not runs:
        st.info("No benchmark has run yet.")
    for run in runs:
        _run(run)
