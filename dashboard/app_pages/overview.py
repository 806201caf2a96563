"""Overview: tokens, requests, spend and savings against plain decoding, per model."""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard import charts
from dashboard.app_pages.live import live_panel
from dashboard.app_pages.periods import choose_period, choose_price_kind, price_note
from dashboard.client import AdminClient, admin_client, shows_api_errors
from dashboard.schemas import PriceKind, Spend, Usage, UsageRow


def _totals(usage: Usage) -> UsageRow:
    rows = usage.data
    return UsageRow(
        requests=sum(r.requests for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        cost_usd=sum(r.cost_usd for r in rows),
        baseline_cost_usd=sum(r.baseline_cost_usd for r in rows),
        savings_usd=sum(r.savings_usd for r in rows),
    )


def _usd_per_mtok(row: UsageRow) -> float | None:
    return row.cost_usd / row.completion_tokens * 1e6 if row.completion_tokens else None


def _ledger(usage: Usage, label: str) -> None:
    """What the traffic cost at capacity prices, and what speculative decoding saved."""
    total = _totals(usage)
    cols = st.columns(4)
    cols[0].metric(f"Requests ({label})", f"{total.requests:,}")
    cols[1].metric("Output tokens", f"{total.completion_tokens:,}")
    cols[2].metric("Capacity cost", f"${total.cost_usd:,.4f}")
    saved = total.savings_usd / total.baseline_cost_usd if total.baseline_cost_usd else 0.0
    cols[3].metric(
        "Saved vs plain",
        f"${total.savings_usd:,.4f}",
        f"{saved:.0%} less than plain",
        delta_arrow="off",
    )
    st.dataframe(
        [
            {
                "model": r.model,
                "method": r.method,
                "requests": r.requests,
                "input tokens": r.prompt_tokens,
                "output tokens": r.completion_tokens,
                "capacity cost (USD)": r.cost_usd,
                "plain would cost (USD)": r.baseline_cost_usd,
                "saved (USD)": r.savings_usd,
                "USD per 1M output tokens": _usd_per_mtok(r),
            }
            for r in usage.data
        ],
        hide_index=True,
    )
    st.altair_chart(charts.usage_by_model(usage.data))


def _trend(api: AdminClient, start: dt.datetime) -> None:
    """Cost and savings per day since `start` (one rollup read per day)."""
    today = dt.datetime.now(dt.UTC).date()
    days = []
    for offset in range((today - start.date()).days + 1):
        day = start + dt.timedelta(days=offset)
        rows = api.usage(day, "model", day + dt.timedelta(days=1)).data
        days.append((day.date(), sum(r.cost_usd for r in rows), sum(r.savings_usd for r in rows)))
    st.altair_chart(charts.daily_trend(days))


def _spend(spend: Spend, label: str) -> None:
    """GPU-hours held, idle included: the other view, never mixed with capacity cost."""
    total = "no price" if spend.total_usd is None else f"${spend.total_usd:,.2f}"
    st.metric(f"Actual GPU spend ({label}, {spend.price_kind})", total)
    if spend.unpriced_gpu_hours:
        st.warning(
            f"{spend.unpriced_gpu_hours:,.2f} GPU-hours have no {spend.price_kind} price: "
            "set one on the Prices page to see the bill."
        )
    st.dataframe(
        [
            {
                "backend": r.backend,
                "model": r.model,
                "method": r.method,
                "GPU": f"{r.gpu_count}x {r.gpu_type}",
                "GPU-hours": round(r.gpu_hours, 4),
                "USD per GPU-hour": r.usd_per_gpu_hour,
                "USD": "no price" if r.usd is None else f"${r.usd:,.4f}",
            }
            for r in spend.data
        ],
        hide_index=True,
    )


def _totals_panel(label: str, start: dt.datetime, kind: PriceKind) -> None:
    """Traffic, capacity cost and savings, then actual GPU spend: two views, never mixed."""
    api = admin_client()
    prices, gpu_types = api.prices(), {b.gpu_type for b in api.backends()}
    usage = api.usage(start)
    st.subheader("Traffic, capacity cost and savings")
    served_at = price_note(prices, "on-demand", gpu_types)
    st.caption(
        "Capacity cost: each request's output tokens at its method's $ per 1M tokens, priced "
        f"when it was served at {served_at}."
    )
    if not usage.data:
        st.info(
            f"No requests in this period ({label}). Send traffic to the gateway's /v1 "
            "endpoint; the ledger rolls it up here within seconds."
        )
    else:
        _ledger(usage, label)
    st.subheader("GPU spend")
    st.caption(
        "GPU-hours each backend was held, idle included, at " + price_note(prices, kind, gpu_types)
    )
    _spend(api.spend(start, kind), label)


@shows_api_errors
def render() -> None:
    """The Overview page."""
    st.title("Overview")
    api = admin_client()
    label, start = choose_period("overview-period")
    kind = choose_price_kind("overview-price")
    live_panel(lambda: _totals_panel(label, start, kind), "overview-live")
    if label != "today":
        st.subheader("Day by day")
        _trend(api, start)
        st.caption("Capacity cost and savings vs plain per UTC day, from the hourly rollups.")
