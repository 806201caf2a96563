"""Methods: per model, throughput and cost of each method by load, and the policy control."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import streamlit as st

from dashboard import charts
from dashboard.audit_view import MOVES, audit_rows, candidates
from dashboard.client import AdminClient, admin_client, offers_changes, shows_api_errors
from dashboard.formats import NO_DATA, count, ms, or_missing, usd
from dashboard.lossless_view import OFF_NOTE, READING_NOTE, group_rows, replays_note, summary
from dashboard.schemas import Backend, BenchmarkLevel, ModelInfo, Plan, Policy
from dashboard.widgets.curves import live_curves
from dashboard.widgets.flash import changed, show_flash
from dashboard.widgets.periods import choose_price_kind, period_start

GPUS = ("B200", "H100")
TRAFFIC_WINDOW = dt.timedelta(hours=1)
LOSSLESS_PERIOD = "30 days"


def _choose_model(models: list[ModelInfo], backends: list[Backend]) -> str | None:
    names = sorted({m.name for m in models} | {b.model for b in backends})
    if not names:
        st.info(
            "No models yet. Register a backend on the Backends page (or in fleet.yaml); "
            "its model appears here."
        )
        return None
    linked = st.query_params.get("model")  # /methods?model=... opens on that model
    index = names.index(linked) if linked in names else 0
    chosen: str = st.selectbox("Model", names, index=index, key="methods-model")
    st.query_params["model"] = chosen  # the address links to what is shown
    return chosen


def _cost_table(plans: dict[str, Plan]) -> None:
    """Per concurrency: the planner's choice, and $ per 1M output tokens on each GPU."""
    first = next(iter(plans.values()))
    rows = []
    for i, choice in enumerate(first.choices):
        row: dict[str, object] = {
            "concurrency": choice.concurrency,
            "best method": choice.method,
            "K": choice.k,
            "output tokens/s": count(choice.output_tokens_per_s),
            "per-token latency": ms(choice.itl_ms),
            "point": choice.source,
        }
        for gpu, plan in plans.items():
            here = plan.choices[i]
            row[f"{gpu} best"] = f"{here.method} K={here.k}"
            row[f"$/1M {gpu} best"] = f"{usd(here.usd_per_mtok)} ±{plan.fit.relative_95:.0%}"
            row[f"$/1M {gpu} plain"] = usd(here.usd_per_mtok * here.speedup_vs_plain)
        rows.append(row)
    st.dataframe(rows, hide_index=True)


def _price_caption(plans: dict[str, Plan]) -> str:
    return "Prices: " + "; ".join(
        f"{gpu} ${p.price.usd_per_gpu_hour:.2f}/GPU-h {p.price.kind} ({p.price.source}, "
        f"{p.price.date}, {p.price.origin})"
        for gpu, p in plans.items()
    )


def _recommendation(plan: Plan) -> None:
    moves = [f"{c.from_method} → {c.to_method} at {c.concurrency} streams" for c in plan.crossovers]
    crossings = ", ".join(moves) or "none: one method wins at every load"
    st.markdown(f"**Crossovers on {plan.gpu}:** {crossings}")
    low, high = plan.choices[0], plan.choices[-1]
    st.success(
        f"Recommendation on {plan.gpu}: {low.method} (K={low.k}) at {low.concurrency} "
        f"stream(s), {high.method} (K={high.k}) at {high.concurrency} streams; "
        f"fitted to {plan.fit.measurements} measurement(s)."
    )


def _acceptance(api: AdminClient, model: str, backends: list[Backend]) -> None:
    """Acceptance per backend now (scrapes), then per load from finished benchmark sweeps."""
    st.subheader("Measured acceptance and latency")
    mine = [b for b in backends if b.model == model]
    _live_acceptance(mine)
    by_name = {b.name: b for b in mine}
    rows, curves = [], {}
    for run in sorted(api.benchmarks(), key=lambda r: r.id):
        backend = by_name.get(run.backend_name or "")
        if run.model != model or backend is None:
            continue
        for level in BenchmarkLevel.of(run):
            rows.append(_acceptance_row(backend, level))
            if level.acceptance_per_position and level.concurrency == 1:
                curves[backend.name] = level.acceptance_per_position
    if not rows:
        st.info(
            "No benchmark sweep of this model's backends yet: start one on the Benchmarks "
            "page for acceptance and latency at set loads."
        )
        return
    st.markdown("**By load, from benchmark sweeps**")
    st.dataframe(rows, hide_index=True)
    if curves:
        st.altair_chart(charts.acceptance_by_position(curves))
        st.caption("Per-position acceptance at concurrency 1, the latest sweep of each backend.")


def _live_acceptance(backends: list[Backend]) -> None:
    """Each drafting backend's acceptance as the gateway sees it now."""
    live = [
        (b, b.runtime)
        for b in backends
        if b.method != "plain" and b.runtime and b.runtime.acceptance_length is not None
    ]
    if not live:
        st.info("No acceptance seen yet: it shows once a drafting backend serves traffic.")
        return
    st.markdown("**Now: each backend's latest acceptance**")
    rows = []
    for b, runtime in live:
        rows.append(
            {
                "backend": b.name,
                "method": b.method,
                "K": b.k,
                "acceptance length": round(runtime.acceptance_length or 0.0, 2),
                "accepted per position": " ".join(
                    f"{rate:.0%}" for rate in runtime.acceptance_per_position or []
                ),
                "from": "live scrape"
                if runtime.acceptance_source == "scrape"
                else "last stored measurement",
            }
        )
    st.dataframe(rows, hide_index=True)
    curves = {b.name: r.acceptance_per_position for b, r in live if r.acceptance_per_position}
    if curves:
        st.altair_chart(charts.acceptance_by_position(curves))


def _acceptance_row(backend: Backend, level: BenchmarkLevel) -> dict[str, object]:
    per_position = level.acceptance_per_position or []
    return {
        "backend": backend.name,
        "method": backend.method,
        "K": or_missing(backend.k),
        "concurrency": level.concurrency,
        "output tokens/s": count(level.output_tokens_per_s),
        "per-token latency": ms(level.mean_tpot_ms),
        "inter-chunk latency": ms(level.mean_itl_ms),
        "acceptance length": or_missing(level.acceptance_length),
        "accepted per position": " ".join(f"{rate:.0%}" for rate in per_position),
    }


def _lossless(api: AdminClient, model: str) -> None:
    """Whether speculation changed greedy answers: the watchdog's checks beside the floor."""
    st.subheader(f"Lossless: served answers against their replays ({LOSSLESS_PERIOD})")
    report = api.lossless(model, period_start(LOSSLESS_PERIOD))
    found = next((m for m in report.models if m.model == model), None)
    if found is None or not found.groups:
        st.caption(OFF_NOTE)
    else:
        st.markdown(summary(found))
        st.dataframe(group_rows(found.groups), hide_index=True)
        st.caption(READING_NOTE)
    if found is not None:
        st.caption(replays_note(found.replays))


def _traffic(api: AdminClient, model: str) -> None:
    """Which methods served this model in the last hour: where a policy change shows."""
    usage = api.usage(dt.datetime.now(dt.UTC) - TRAFFIC_WINDOW, "model,method")
    rows = [
        {"method": r.method, "requests": r.requests, "output tokens": r.completion_tokens}
        for r in usage.data
        if r.model == model
    ]
    st.subheader("Traffic by method, last hour")
    if rows:
        st.dataframe(rows, hide_index=True)
    else:
        st.info("No requests for this model in the last hour.")


def _policy_from_form(current: Policy, methods: list[str]) -> tuple[Policy, bool] | None:
    """The policy form; when it is submitted, the policy to save and whether to move to a
    newly pinned method at once; else None."""
    with st.form("policy"):
        mode = st.radio(
            "Mode",
            ["auto", "pinned"],
            index=["auto", "pinned"].index(current.mode),
            horizontal=True,
            key="policy-mode",
        )
        index = methods.index(current.method) if current.method in methods else 0
        method = st.selectbox("Pinned method", methods, index=index, key="policy-method")
        k = st.number_input(
            "Pinned K (0: the backend's own)", 0, 64, current.k or 0, key="policy-k"
        )
        itl = st.number_input(
            "Per-token latency objective, ms (0: none)",
            0.0,
            10_000.0,
            current.itl_objective_ms or 0.0,
            key="policy-itl",
        )
        explore = st.slider(
            "Explore fraction", 0.0, 0.5, current.explore_fraction, 0.01, key="policy-explore"
        )
        text = st.text_area(
            "Rules, checked in order (JSON list; features in docs/fleet.md)",
            json.dumps(current.rules),
            help='e.g. [{"when": ["structured_output"], "method": "plain"}]',
            key="policy-rules",
        )
        classes_text = st.text_area(
            "Request classes' objectives under auto (JSON object; docs/fleet.md)",
            json.dumps(current.classes),
            help='e.g. {"interactive": {"objective": "latency", "max_usd_per_mtok": 0.5}, '
            '"batch": {"objective": "cost"}}',
            key="policy-classes",
        )
        immediate = st.checkbox("Move all traffic at once (else in steps)", key="policy-immediate")
        if not st.form_submit_button("Save policy", key="policy-save"):
            return None
    parsed = _rules_and_classes(text, classes_text)
    if parsed is None:
        return None
    rules, classes = parsed
    pinned = mode == "pinned"
    # A copy: what the form does not edit (drafter_trial, lossless_quarantine) is kept
    policy = current.model_copy(
        update={
            "mode": "pinned" if pinned else "auto",
            "method": method if pinned else None,
            "k": int(k) if pinned and k and method != "plain" else None,
            "itl_objective_ms": float(itl) or None,
            "explore_fraction": float(explore),
            "rules": rules,  # the admin API checks each feature (422 naming the vocabulary)
            "classes": classes,  # and each objective
        }
    )
    return policy, immediate


def _rules_and_classes(
    rules_text: str | None, classes_text: str | None
) -> tuple[list[Any], dict[str, Any]] | None:
    """The form's rules and classes, or None after saying what is wrong with them."""
    rules = _json_field(
        rules_text or "[]", list, "Rules are a JSON list of {when, method, k} objects"
    )
    classes = _json_field(
        classes_text or "{}", dict, "Classes are a JSON object of {name: {objective, ...}}"
    )
    if rules is None or classes is None:
        return None
    return rules, classes


def _json_field(text: str, kind: type, wrong: str) -> Any:
    """A form field's JSON of the given kind, or None after saying what is wrong with it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        st.error(f"{wrong}; this is not JSON: {exc}")
        return None
    if not isinstance(value, kind):
        st.error(wrong)
        return None
    return value


def _control(api: AdminClient, model: str, models: list[ModelInfo], methods: list[str]) -> None:
    """Set the model's policy through the admin API; show it and its audit trail."""
    st.subheader("Policy")
    current = next((m.policy for m in models if m.name == model), Policy())
    shown = st.empty()  # filled once the form is handled
    move = next((m.move for m in models if m.name == model), None)
    wanted = _policy_from_form(current, methods) if offers_changes(api) else None
    if wanted is not None:
        saved = api.set_policy(model, *wanted)
        changed(f"Policy of {model} set to {_describe(saved.policy)}", warnings=saved.warnings)
    shown.write(f"Current: **{_describe(current)}**")
    if move is not None:
        st.info(
            f"Moving from {move.source} to {move.target}: {move.target_share:.0%} of the "
            f"traffic now, {move.step_share:.0%} more every {move.step_s:g} s, all of it at "
            f"{move.ends_at:%H:%M:%S} UTC"
        )
    _rules(current)
    _classes(current)
    if current.drafter_trial:
        trial = current.drafter_trial
        st.caption(
            f"Drafter trial: {trial.get('share', 0):.0%} of each method's requests go to its "
            f"backends running {trial.get('drafter')}, the rest to its other backends "
            "(the Savings report's `group_by=drafter` puts the two side by side)"
        )
    entries = api.audit("model", model, limit=5)
    if entries:
        st.caption("Recent changes (audit log)")
        st.dataframe(audit_rows(entries), hide_index=True)
        latest = next((e for e in entries if e.action in MOVES), None)
        if latest is not None:
            st.caption(
                f"The candidates of the latest automatic choice ({latest.at:%H:%M:%S} UTC): "
                "each method's price and per-token latency at that load"
            )
            st.dataframe(candidates(latest), hide_index=True)


def _rules(policy: Policy) -> None:
    """The policy's rules, in the order they are checked."""
    if not policy.rules:
        st.caption(
            "No rules: every request follows the policy. Rules (PUT the policy's `rules`) send "
            "requests with given features, such as structured output, to a method of their own."
        )
        return
    st.caption("Rules, checked in order before the policy (the first match picks the method)")
    rows = [
        {"#": i, "when": " and ".join(r.get("when", [])), "method": r.get("method"),
         "K": r.get("k") or NO_DATA}
        for i, r in enumerate(policy.rules)
    ]  # fmt: skip
    st.dataframe(rows, hide_index=True)


def _classes(policy: Policy) -> None:
    """The request classes with an objective of their own under auto."""
    if not policy.classes:
        return
    st.caption("Request classes (x-draftgate-class, else the key's): what auto optimises")
    rows = [
        {"class": name, "objective": c.get("objective", "cost"),
         "per-token latency ceiling (ms)": c.get("itl_objective_ms") or NO_DATA,
         "cost ceiling ($/1M)": c.get("max_usd_per_mtok") or NO_DATA}
        for name, c in policy.classes.items()
    ]  # fmt: skip
    st.dataframe(rows, hide_index=True)


def _describe(policy: Policy) -> str:
    if policy.mode == "pinned":
        k = f" K={policy.k}" if policy.k else ""
        text = f"pinned to {policy.method}{k}"
    else:
        text = "auto (the planner's choice by load)"
    itl = f", per-token ≤ {policy.itl_objective_ms:g} ms" if policy.itl_objective_ms else ""
    return f"{text}{itl}, explore {policy.explore_fraction:.0%}"


@shows_api_errors
def render() -> None:
    """The Methods page."""
    st.title("Methods")
    show_flash()
    api = admin_client()
    models, backends = api.models(), api.backends()
    model = _choose_model(models, backends)
    if model is None:
        return
    kind = choose_price_kind("methods-price")
    plans = {gpu: api.plan(model, gpu, price_kind=kind) for gpu in GPUS}
    st.caption(_price_caption(plans))
    live_curves(api, model)
    st.subheader("The planner: best method and K per load (what-if)")
    _recommendation(plans["B200"])
    _cost_table(plans)
    st.caption(
        "The planner's lines per method and K, beside the points they were fitted to, are on "
        "the Planner page: a what-if. The chart above is what prices requests now."
    )
    _acceptance(api, model, backends)
    _lossless(api, model)
    methods = sorted({b.method for b in backends if b.model == model}) or ["plain"]
    _control(api, model, models, methods)
    _traffic(api, model)
