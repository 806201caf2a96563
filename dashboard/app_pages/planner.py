"""Planner / what-if: cost per month, GPUs and savings per method for a traffic, and the
vLLM configuration to deploy."""

from __future__ import annotations

import streamlit as st

from dashboard import charts
from dashboard.client import AdminApiError, AdminClient, admin_client, shows_api_errors
from dashboard.formats import usd
from dashboard.schemas import Backend, Capacity, DecodingMethod, MethodCapacity, Plan
from dashboard.widgets.curves import live_curves
from dashboard.widgets.periods import choose_price_kind

WORKLOADS = ("chat", "code", "math", "mixed")
ENGINES = ("vllm", "sglang")  # the calibrated engines (planner/data/calibration.yaml)


def _planner_lines(api: AdminClient, model: str, plan: Plan) -> None:
    """The planner's throughput per method at its best K for each load: the what-if's lines,
    beside the measured points they were fitted to."""
    measured = [p for p in api.accuracy().points if p.model == model and p.gpu_type == plan.gpu]
    st.subheader("The planner's lines (what-if)")
    st.altair_chart(charts.throughput_vs_concurrency(plan.methods, measured, plan.gpu_count))
    st.caption(
        f"{plan.gpu}: a line per method at its best K for each load, the planner's "
        f"(solid between measured points, dashed where estimated; points filled where "
        f"measured, hollow where estimated); diamonds are the "
        f"{len(measured)} measured point(s). Requests are priced by the curves below."
    )


def _capacity_table(capacity: Capacity) -> None:
    vs_plain = capacity.savings_usd_per_month.get("vs_plain", {})
    vs_plain_95 = capacity.savings_usd_per_month_95.get("vs_plain", {})
    st.dataframe(
        [
            {
                "method": c.method,
                "K": c.k,
                "replicas": c.replicas,
                "GPUs": c.gpus,
                "streams per replica": c.concurrency_per_replica,
                "per month": usd(c.usd_per_month),
                "USD per month, 95%": _interval(c.usd_per_month_95),
                "saves vs plain per month": usd(vs_plain.get(c.method, 0.0)),
                "saves vs plain, 95%": _interval(vs_plain_95.get(c.method)),
            }
            for c in sorted(capacity.methods, key=lambda c: c.usd_per_month)
        ],
        hide_index=True,
    )


def _interval(usd: tuple[float, float] | None) -> str:
    return "too little data" if usd is None else f"${usd[0]:,.0f} to ${usd[1]:,.0f}"


def _drafter(method: DecodingMethod, backends: list[Backend]) -> str | None:
    """The drafter this fleet already uses for `method`, else a placeholder where one is needed."""
    known = next((b.drafter for b in backends if b.method == method.id and b.drafter), None)
    return known or ("DRAFTER" if method.drafter_required else None)


def _deploy(api: AdminClient, plan: Plan, best: MethodCapacity, backends: list[Backend]) -> None:
    """`vllm serve` and a compose service for the cheapest method, with its K schedule."""
    schedule = plan.schedules.get(best.method)
    # vLLM drafts num_speculative_tokens at most: the schedule's largest K bounds it below.
    k = max([best.k, *(entry[2] for entry in schedule or [])])
    method = next((m for m in api.methods() if m.id == best.method), None)
    if method is None:
        st.warning(f"No vLLM configuration for {best.method}: the gateway does not know it")
        return
    try:
        rendering = api.render_method(
            plan.model,
            method.id,
            k=k if method.speculative else None,
            drafter=_drafter(method, backends),
            k_per_batch_size=schedule,
            gpu_count=plan.gpu_count,
        )
    except AdminApiError as exc:
        if exc.status_code != 422:  # not a refused spec: the page shows it as an error
            raise
        st.warning(f"No vLLM configuration for {best.method}: {exc.message}")
        return
    st.markdown(f"**Deploy {best.method} (K={k})** on {best.gpus} x {plan.gpu}:")
    if k != best.k:  # the table's K is the one at this traffic's load
        st.caption(
            f"K={k} is what vLLM is started with: the schedule's largest, drafted at small "
            f"batches. At this traffic's {best.concurrency_per_replica:g} streams per replica "
            f"it drafts K={best.k}, the table's."
        )
    st.code(rendering.command, language="bash")
    st.code(rendering.compose_yaml, language="yaml")
    if schedule:
        st.caption(
            f"num_speculative_tokens_per_batch_size: {schedule} "
            "([batch from, batch to, K]; K 0 where plain decoding is faster)"
        )


@shows_api_errors
def render() -> None:
    """The Planner / what-if page."""
    st.title("Planner / what-if")
    api = admin_client()
    backends = api.backends()
    models = sorted({m.name for m in api.models()} | {b.model for b in backends})
    if not models:
        st.info("No models yet: register a backend first, then plan for its model here.")
        return
    left, right = st.columns(2)
    model = left.selectbox("Model", models, key="plan-model")
    gpu = right.selectbox("GPU", [g.name for g in api.gpus()], key="plan-gpu")
    gpu_count = left.number_input("GPUs per replica", 1, 64, 1, key="plan-gpu-count")
    kind = choose_price_kind("plan-price")
    requests_per_s = left.number_input("Requests per second", 0.01, 10_000.0, 100.0, key="plan-rps")
    output_len = right.number_input(
        "Output tokens per request", 1, 32_768, 500, key="plan-output-len"
    )
    workload = right.selectbox("Workload (acceptance profile)", WORKLOADS, key="plan-workload")
    itl = left.number_input("Per-token latency objective, ms", 1.0, 1000.0, 50.0, key="plan-itl")
    engine = right.selectbox("Engine", ENGINES, key="plan-engine")
    plan = api.plan(
        model,
        gpu,
        gpu_count=gpu_count,
        price_kind=kind,
        workload=workload,
        itl_objective_ms=itl,
        output_tokens_per_s=requests_per_s * output_len,
        engine=engine,
    )
    st.caption(
        f"{plan.engine}'s scheduling; {gpu} at ${plan.price.usd_per_gpu_hour:.2f}/GPU-h {kind} "
        f"({plan.price.source}, "
        f"{plan.price.date}); {requests_per_s * output_len:,.0f} output tokens/s"
    )
    if plan.capacity is None or not plan.capacity.methods:
        st.info("The planner found no method that meets this objective.")
        return
    _capacity_table(plan.capacity)
    _deploy(api, plan, min(plan.capacity.methods, key=lambda c: c.usd_per_month), backends)
    _planner_lines(api, model, plan)
    live_curves(api, model, gpu)
    st.caption(
        "The what-if above is the planner fitted to this model's measurements; live requests "
        "are priced, `auto` decides and the fleet report sizes from the curves just above."
    )
