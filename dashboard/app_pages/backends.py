"""Backends: every vLLM server the gateway routes to; add, disable or remove one."""

from __future__ import annotations

import streamlit as st

from dashboard.client import AdminClient, admin_client, offers_changes, shows_api_errors
from dashboard.formats import NO_DATA, or_missing, share
from dashboard.schemas import Backend, Pool, PoolDns, PoolService
from dashboard.widgets.flash import changed, show_flash
from dashboard.widgets.live import live_panel

ACCEPTANCE_SOURCES = {"scrape": "live scrape", "measurement": "last stored measurement"}


def _health(b: Backend) -> str:
    if not b.enabled:
        return "disabled"
    if b.runtime is None:
        return "not seen yet"
    if not b.runtime.healthy:
        return "down"
    return "circuit open" if b.runtime.circuit_open else "healthy"


def _acceptance(b: Backend) -> dict[str, str]:
    """Mean acceptance length and per-position acceptance, or NO_DATA."""
    runtime = b.runtime
    if runtime is None or runtime.acceptance_length is None or b.method == "plain":
        return {
            "acceptance length": NO_DATA,
            "accepted per position": NO_DATA,
            "acceptance from": NO_DATA,
        }
    positions = runtime.acceptance_per_position or []
    return {
        "acceptance length": f"{runtime.acceptance_length:.2f}",
        "accepted per position": " ".join(f"{rate:.0%}" for rate in positions) or NO_DATA,
        "acceptance from": ACCEPTANCE_SOURCES.get(runtime.acceptance_source or "", NO_DATA),
    }


def _table(backends: list[Backend]) -> None:
    st.dataframe(
        [
            {
                "name": b.name,
                "health": _health(b),
                "method": b.method,
                "K": or_missing(b.k),
                "in flight": or_missing(b.runtime.in_flight if b.runtime else None),
                "waiting": or_missing(b.runtime.waiting if b.runtime else None),
                "KV cache": share(b.runtime.kv_cache_usage if b.runtime else None),
                **_acceptance(b),
                "pool": or_missing(b.pool),
                "model": b.model,
                "drafter": or_missing(b.drafter),
                "GPU": f"{b.gpu_count} x {b.gpu_type}",
                "managed": b.managed,
                "url": b.url,
            }
            for b in backends
        ],
        hide_index=True,
    )
    for b in backends:
        if b.runtime is not None and b.runtime.method_mismatch:
            st.warning(f"{b.name}: {b.runtime.method_mismatch}")
        if b.runtime is not None and b.runtime.pricing != "curve":
            st.warning(f"{b.name}: {PRICING_WARNINGS[b.runtime.pricing]}")


PRICING_WARNINGS = {
    "gpu_time": (
        "no throughput curve prices this model's method on this GPU yet (no planner spec, no "
        "measurement): its requests are charged their share of the backend's GPU time "
        "(+-100%), and no saving is claimed for them. Benchmark it to price it by a curve."
    ),
    "unpriced": "its GPU type has no price: its requests cost nothing in any $ figure.",
}


def _pools(pools: list[Pool], backends: list[Backend]) -> None:
    """Each pool: where its members are found, how many are healthy, and whether the last
    resolution worked."""
    by_name = {b.name: b for b in backends}
    st.subheader("Pools")
    st.dataframe(
        [
            {
                "pool": p.name,
                "found at": _found_at(p.discovery),
                "method": p.backend.method,
                "K": or_missing(p.backend.k),
                "members": len(p.members),
                "healthy": sum(_health(by_name[m]) == "healthy" for m in p.members if m in by_name),
                "GPUs": f"{len(p.members) * p.backend.gpu_count} x {p.backend.gpu_type}",
                "discovery": "ok" if p.discovery_error is None else f"failing: {p.discovery_error}",
            }
            for p in pools
        ],
        hide_index=True,
    )
    st.caption(
        "A pool's members are the addresses its DNS name answers (a headless Service's ready "
        "pods) or its Kubernetes Service's ready endpoints, each a backend above once its "
        "/health answers. A failing source keeps the members last seen."
    )


def _found_at(source: PoolDns | PoolService) -> str:
    """Where a pool's members are found, and the port they serve on."""
    if isinstance(source, PoolDns):
        return f"{source.dns}:{source.port}"
    namespace = f"{source.namespace}/" if source.namespace else ""
    return f"service {namespace}{source.service}:{source.port}"


def _runtime() -> None:
    """The backends now: health, load and acceptance (a live panel)."""
    api = admin_client()
    backends, pools = api.backends(), api.pools()
    if not backends:
        st.info(
            "No backends yet. Add one below (a vLLM server's base URL, its model and "
            "decoding method), or declare them in fleet.yaml."
        )
    else:
        _table(backends)
        st.caption(
            "Health and load as this gateway replica sees them now: its requests in flight, "
            "and each server's own queue and KV-cache use from its last /metrics scrape. "
            "Acceptance: mean accepted length per draft and the share accepted at each draft "
            "position, from the last scrape in which the server drafted, else its latest "
            f"stored measurement; {NO_DATA} for plain decoding or before any data."
        )
    if pools:
        _pools(pools, backends)


def _add_form(api: AdminClient) -> None:
    """A new backend, registered through the admin API."""
    with st.form("add-backend", clear_on_submit=True):
        st.subheader("Add a backend")
        left, right = st.columns(2)
        name = left.text_input("Name", key="add-name")
        url = right.text_input("Base URL (without /v1)", key="add-url")
        model = left.text_input("Model", key="add-model")
        methods = [m.id for m in api.methods()]  # the catalog the admin API validates against
        method = right.selectbox("Method", methods, key="add-method")
        k = left.number_input("K (0: the method's default)", 0, 64, 0, key="add-k")
        drafter = right.text_input("Drafter (if the method needs one)", key="add-drafter")
        gpu_type = left.selectbox("GPU", [g.name for g in api.gpus()], key="add-gpu")
        gpu_count = right.number_input("GPUs", 1, 1024, 1, key="add-gpu-count")
        if not st.form_submit_button("Add backend", key="add-save"):
            return
    fields: dict[str, object] = {
        "name": name,
        "url": url,
        "model": model,
        "method": method,
        "k": int(k) or None,
        "drafter": drafter or None,
        "gpu_type": gpu_type,
        "gpu_count": int(gpu_count),
    }
    added = api.add_backend(fields)
    changed(f"Added {added.name} ({added.method}) for {added.model}")


def _change_form(api: AdminClient, backends: list[Backend]) -> None:
    """Enable, disable or remove one backend."""
    st.subheader("Change a backend")
    name = st.selectbox("Backend", [b.name for b in backends], key="change-name")
    chosen = next(b for b in backends if b.name == name)
    left, right = st.columns(2)
    label = "Disable" if chosen.enabled else "Enable"
    if left.button(f"{label} {name}", key="change-toggle"):
        updated = api.set_backend_enabled(name, not chosen.enabled)
        changed(f"{updated.name} is now {'enabled' if updated.enabled else 'disabled'}")
    sure = right.checkbox(f"Yes, remove {name}", key="change-sure")
    if right.button("Remove", key="change-remove", disabled=not sure):
        api.remove_backend(name)
        changed(f"Removed {name}")


@shows_api_errors
def render() -> None:
    """The Backends page."""
    st.title("Backends")
    show_flash()
    api = admin_client()
    live_panel(_runtime, "backends-live")
    backends = api.backends()
    if not offers_changes(api):
        return
    if backends:
        _change_form(api, backends)
    _add_form(api)
