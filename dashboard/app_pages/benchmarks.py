"""Benchmarks: start a load sweep against a backend, follow it, read its results."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard.client import (
    CACHE_TTL_S,
    AdminClient,
    admin_client,
    refresh_reads,
    shows_api_errors,
)
from dashboard.schemas import Backend, Benchmark

LEVEL_COLUMNS = {
    "concurrency": "concurrency",
    "completed": "completed",
    "failed": "failed",
    "output_tokens_per_s": "output tokens/s",
    "mean_ttft_ms": "TTFT (ms)",
    "mean_itl_ms": "ITL (ms)",
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
    st.success(f"Started benchmark {run.id} against {name}: levels {concurrency}")


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
    st.button("Refresh", key="bench-refresh", on_click=refresh_reads)
    api = admin_client()
    backends = api.backends()
    if not backends:
        st.info("No backends to benchmark yet: add one on the Backends page.")
        return
    _start_form(api, backends)
    _runs()


@st.fragment(run_every=CACHE_TTL_S)
@shows_api_errors
def _runs() -> None:
    """Every run, newest first; redrawn every few seconds while the page is open."""
    runs = sorted(admin_client().benchmarks(), key=lambda r: r.id, reverse=True)
    if not runs:
        st.info("No benchmark has run yet.")
    for run in runs:
        _run(run)
    st.caption("Each finished level is stored as a measurement: the planner fits to it.")
