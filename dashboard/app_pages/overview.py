"""Overview: the bill, right-sized bills, achievable savings, GPUs to release; then capacity cost.

Three answers lead, each a different figure: what the GPUs held cost (the bill); what the
traffic would cost on a fleet sized for it, per method, and the money that saves against
plain (achievable savings); how many GPUs the load needs now per method pool. The
per-request capacity cost, a unit for comparing methods and not money saved, comes after.
"""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard import charts
from dashboard.client import AdminClient, admin_client, shows_api_errors
from dashboard.formats import money, ms, ratio, usd_interval
from dashboard.schemas import (
    Backend,
    Fleet,
    FleetObjective,
    PriceKind,
    Spend,
    Usage,
    UsageRow,
)
from dashboard.widgets.downloads import usage_csv_button
from dashboard.widgets.live import live_panel
from dashboard.widgets.periods import choose_period, choose_price_kind, price_note
from dashboard.widgets.verdict import held_and_wanted, reconciled, verdict


def _pays(objective: FleetObjective) -> str:
    below = objective.speculation_pays_below_itl_ms
    if below is None:
        return ", none this traffic's fleets reach below plain's bill"
    return f": for this traffic, one of {below:.1f} ms per token or less (set it on Methods)"


def _fleet(fleet: Fleet, backends: list[Backend], label: str) -> None:
    """The three answers for one model (the GPUs alone when its GPUs have no price)."""
    if fleet.actual.spend_usd is None and all(m.bill_usd is None for m in fleet.methods):
        gpus = ", ".join(sorted({m.gpu_type for m in fleet.methods})) or "its GPUs"
        st.warning(
            f"No {fleet.price_kind} price for {gpus}: no bill, right-sized bill or saving "
            "can be shown at that price. Set one on the [Prices](prices) page, or choose "
            "another kind above."
        )
        _release(fleet, backends)
        return
    verdict(fleet, backends, label)
    _headline(fleet, label)
    st.caption(reconciled(fleet))
    st.caption(_sizing_note(fleet))
    _methods(fleet)
    _release(fleet, backends)
    _latency(fleet)


def _headline(fleet: Fleet, label: str) -> None:
    """The bill, the best right-sized bill, achievable savings and over-provisioning."""
    by_method = {m.method: m for m in fleet.methods}
    best = by_method.get(fleet.best) if fleet.best else None
    cols = st.columns(4)
    cols[0].metric(
        f"Bill ({label})",
        money(fleet.actual.spend_usd),
        f"{fleet.actual.gpu_hours:,.1f} GPU-hours held",
        delta_arrow="off",
    )
    cols[1].metric(
        "Right-sized bill (best method)",
        money(best.bill_usd) if best else "no method meets the objective",
        usd_interval(best.bill_usd_95) if best else None,  # the method and curve: the note
        delta_arrow="off",
    )
    cols[2].metric(
        "Achievable savings vs plain",
        money(fleet.achievable_savings_usd),
        usd_interval(fleet.achievable_savings_usd_95),
        delta_arrow="off",
    )
    cols[3].metric(
        "Over-provisioning",
        money(fleet.over_provisioning_usd),
        usd_interval(fleet.over_provisioning_usd_95),
        delta_arrow="off",
    )


def _sizing_note(fleet: Fleet) -> str:
    """How the fleets were sized, and what the figures mean."""
    objective = fleet.objective
    sized = (
        f"within {objective.itl_ms:g} ms per token"
        if objective.itl_ms is not None
        else "for throughput alone (no per-token latency objective: plain often needs the "
        "fewest GPUs; "
        f"speculative decoding pays under a latency objective{_pays(objective)})"
    )
    best = next((m for m in fleet.methods if m.method == fleet.best), None)
    by = f"The best is {best.method}, sized from its {best.source} curve. " if best else ""
    return by + (
        f"Right-sized: whole replicas hour by hour {sized}, {fleet.headroom:.0%} headroom over "
        f"each hour's mean, at the {fleet.price_kind} price. Achievable savings are money only "
        "once the fleet is sized to its traffic; over-provisioning is the bill minus the "
        "right-sized bill of the methods as served. Intervals: each replica sized at both ends "
        "of its curve's 95% band (GET /admin/v1/curves); the bill itself is exact."
    )


def _methods(fleet: Fleet) -> None:
    """Each method's right-sized fleet, a row per method: a replica, then the fleet and its
    bill (two tables, each whole on the page: one of twelve columns was cut at its edge)."""
    st.dataframe(
        [
            {
                "method": m.method,
                "K": m.k,
                "replica": f"{m.gpu_count}x {m.gpu_type}",
                "streams": f"{m.concurrency_per_replica:,.0f}",
                "tokens/s": f"{m.output_tokens_per_s_per_replica:,.0f}",
                "latency at those streams": ms(m.itl_ms),
                "meets objective": "yes" if m.meets_objective else "no",
            }
            for m in fleet.methods
        ],
        hide_index=True,
    )
    st.caption("One replica of each method: its streams, tokens/s and per-token latency.")
    st.dataframe(
        [
            {
                "method": m.method,
                "peak replicas": m.peak_replicas,
                "GPU-hours": f"{m.gpu_hours:,.3f}",
                "right-sized bill": money(m.bill_usd),
                "95% interval": usd_interval(m.bill_usd_95).removeprefix("95%: "),
                "curve": f"{m.source}, ±{m.relative_95:.0%}",
            }
            for m in fleet.methods
        ],
        hide_index=True,
    )
    st.caption("Each method's fleet sized for the traffic, hour by hour, and its bill.")


def _latency(fleet: Fleet) -> None:
    """What speculation buys on the fleet one has: time per token against plain's."""
    if not fleet.latency:
        return
    st.markdown("Latency gain at the fleet you have")
    st.dataframe(
        [
            {
                "method": r.method,
                "output tokens": f"{r.output_tokens:,}",
                "streams per backend": f"{r.concurrency_per_backend:.1f}",
                "per-token latency": ms(r.itl_ms),
                "plain at that load": ms(r.plain_itl_ms),
                "faster than plain": ratio(r.speedup_vs_plain),
            }
            for r in fleet.latency
        ],
        hide_index=True,
    )
    st.caption(
        "From the curves at each method's mean load per backend, hour by hour, weighted by "
        "output tokens: what speculative decoding buys when no GPU is released."
    )


def _release(fleet: Fleet, backends: list[Backend]) -> None:
    """GPUs held now against what the current load needs, per method pool."""
    if fleet.now is None:
        st.info("Desired replicas appear after the selector's first round.")
        return
    held, wanted = held_and_wanted(fleet, backends)
    release = sum(held.values()) - sum(wanted.values())
    st.metric(
        "GPUs you could release now",
        f"{max(release, 0):,}" if release >= 0 else f"add {-release:,}",
        f"load {fleet.now.concurrency:.1f} streams, {fleet.now.output_tokens_per_s:,.0f} tokens/s",
        delta_arrow="off",
    )
    st.dataframe(
        [
            {
                "pool": m,
                "routed now": "yes"
                if m == fleet.now.routed_method
                else f"no (idle: kept at {fleet.idle_pool_replicas})",
                "GPUs held": held.get(m, 0),
                "desired replicas": n,
                "desired GPUs": wanted[m],
            }
            for m, n in sorted(fleet.now.desired_replicas.items())
        ],
        hide_index=True,
    )


def _answers(
    api: AdminClient,
    label: str,
    start: dt.datetime,
    kind: PriceKind,
    objective_ms: float | None = None,
) -> None:
    """The bill, the right-sized bills and the GPUs to release, per model."""
    backends = api.backends()
    models = sorted({b.model for b in backends})
    for model in models:
        if len(models) > 1:
            st.markdown(f"**{model}**")
        _fleet(api.fleet(model, start, kind, objective_ms), backends, label)


def _totals(usage: Usage) -> UsageRow:
    rows = usage.data
    return UsageRow(
        requests=sum(r.requests for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        cost_usd=sum(r.cost_usd for r in rows),
        baseline_cost_usd=sum(r.baseline_cost_usd for r in rows),
        savings_usd=sum(r.savings_usd for r in rows),
        cost_usd_95=(sum(r.cost_usd_95[0] for r in rows), sum(r.cost_usd_95[1] for r in rows)),
        savings_usd_95=(
            sum(r.savings_usd_95[0] for r in rows),
            sum(r.savings_usd_95[1] for r in rows),
        ),
    )


def _spans(interval: tuple[float, float] | None) -> bool:
    """Whether a difference's 95% interval includes 0 (None: no interval, so it may)."""
    return interval is None or interval[0] <= 0 <= interval[1]


def _significance(interval: tuple[float, float] | None) -> str:
    """A difference's 95% interval, and whether it tells the two apart."""
    text = usd_interval(interval, 6).removeprefix("95%: ")
    return f"{text} (includes 0: not significant)" if _spans(interval) else text


def _usd_per_mtok(row: UsageRow) -> float | None:
    return row.cost_usd / row.completion_tokens * 1e6 if row.completion_tokens else None


def _ledger(usage: Usage, label: str) -> None:
    """What the traffic cost at capacity prices, and what speculative decoding saved."""
    total = _totals(usage)
    cols = st.columns(4)
    cols[0].metric(f"Requests ({label})", f"{total.requests:,}")
    cols[1].metric("Output tokens", f"{total.completion_tokens:,}")
    cols[2].metric(
        "Capacity cost",
        f"${total.cost_usd:,.4f}",
        usd_interval(total.cost_usd_95, 4),
        delta_arrow="off",
    )
    less = total.savings_usd / total.baseline_cost_usd if total.baseline_cost_usd else 0.0
    cols[3].metric(
        "Capacity cost vs plain",
        f"${total.savings_usd:,.4f} less",
        usd_interval(total.savings_usd_95, 4),
        delta_arrow="off",
    )
    significant = not _spans(total.savings_usd_95)
    served = [r for r in usage.data if r.requests]  # a group only refused is a row of zeros
    refused = sum(r.refused for r in usage.data)
    st.caption(
        f"Capacity cost vs plain: {less:.0%} below plain decoding at the same load, a unit for "
        "comparing methods and not money saved (the achievable savings above are money)"
        + (
            "."
            if significant
            else "; its interval includes 0, so the difference is not significant."
        )
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
                "plain's capacity cost (USD)": r.baseline_cost_usd,
                "difference (USD)": r.savings_usd,
                "difference, 95% (USD)": _significance(r.savings_usd_95),
                "USD per 1M output tokens": _usd_per_mtok(r),
            }
            for r in served
        ],
        hide_index=True,
    )
    if refused:
        st.caption(
            f"Not in the table: {refused:,} request(s) refused before any backend (a bad key, "
            "a limit, a malformed body, a model this gateway does not serve): no tokens, no cost."
        )
    st.altair_chart(charts.usage_by_model(served))


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
            "set one on the [Prices](prices) page to see the bill."
        )
    st.dataframe(
        [
            {
                "backend": r.backend,
                "model": r.model,
                "method": r.method,
                "GPU": f"{r.gpu_count}x {r.gpu_type}",
                "GPU-hours": f"{r.gpu_hours:,.2f}",
                "USD per GPU-hour": r.usd_per_gpu_hour,
                "USD": "no price" if r.usd is None else f"${r.usd:,.4f}",
            }
            for r in spend.data
        ],
        hide_index=True,
    )


def _totals_panel(
    label: str, start: dt.datetime, kind: PriceKind, objective_ms: float | None = None
) -> None:
    """The three answers and the bill's backends, then traffic at capacity cost."""
    api = admin_client()
    prices, gpu_types = api.prices(), {b.gpu_type for b in api.backends()}
    st.subheader("The bill, fleets sized for the traffic, GPUs to release")
    _answers(api, label, start, kind, objective_ms)
    st.subheader("GPU spend by backend")
    st.caption(
        "GPU-hours each backend was held, idle included, at " + price_note(prices, kind, gpu_types)
    )
    _spend(api.spend(start, kind), label)
    usage = api.usage(start)
    st.subheader("Traffic and capacity cost")
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


@shows_api_errors
def render() -> None:
    """The Overview page."""
    st.title("Overview")
    api = admin_client()
    label, start = choose_period("overview-period")
    kind = choose_price_kind("overview-price")
    what_if = st.number_input(
        "What-if latency objective, ms per token (0: the policy's own)",
        0.0,
        1000.0,
        0.0,
        0.5,
        key="overview-what-if",
        help="Sizes the fleets below for this objective; no policy changes.",
    )
    objective = float(what_if) or None
    live_panel(lambda: _totals_panel(label, start, kind, objective), "overview-live")
    usage_csv_button(api, start, label, widget="overview-usage-csv")
    if label != "today":
        st.subheader("Day by day")
        _trend(api, start)
        st.caption(
            "Capacity cost and its difference from plain per UTC day, from the hourly rollups."
        )
