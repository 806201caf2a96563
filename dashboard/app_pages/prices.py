"""Prices: what a GPU-hour costs, per GPU type and kind (on-demand, reserved, spot), with its
source and date. Every $ figure rests on these; a GPU in use without a price of a kind has no
bill of that kind, and this page says which."""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard.client import AdminClient, admin_client, offers_changes, shows_api_errors
from dashboard.schemas import PRICE_KINDS, Price
from dashboard.widgets.flash import changed, show_flash


def _table(prices: list[Price], in_use: set[str]) -> None:
    st.dataframe(
        [
            {
                "GPU": p.gpu_type,
                "kind": p.kind,
                "USD per GPU-hour": f"${p.usd_per_gpu_hour:,.2f}",
                "source": p.source,
                "date": p.date.isoformat(),
                "in use": "yes" if p.gpu_type in in_use else "no",
            }
            for p in sorted(prices, key=lambda p: (p.gpu_type, PRICE_KINDS.index(p.kind)))
        ],
        hide_index=True,
    )


def missing(prices: list[Price], in_use: set[str]) -> list[tuple[str, str]]:
    """(GPU type, kind) pairs of the GPUs in use that have no price of that kind."""
    known = {(p.gpu_type, p.kind) for p in prices}
    return [(g, k) for g in sorted(in_use) for k in PRICE_KINDS if (g, k) not in known]


def _set_form(api: AdminClient, prices: list[Price], in_use: set[str]) -> None:
    """Set one price: a new (GPU, kind) is added, a known one changed (both audited)."""
    with st.form("set-price", clear_on_submit=False):
        st.subheader("Set a price")
        gpus = sorted(in_use | {p.gpu_type for p in prices}) or ["B200"]
        gpu = st.selectbox("GPU type", gpus, key="price-gpu")
        other = st.text_input("or another GPU type", key="price-gpu-other").strip()
        kind = st.selectbox("Kind", PRICE_KINDS, key="price-kind")
        usd = st.number_input("USD per GPU-hour", 0.0, 1000.0, 0.0, 0.01, key="price-usd")
        source = st.text_input("Source (a provider's price page, a contract)", key="price-source")
        date = st.date_input("As of", dt.datetime.now(dt.UTC).date(), key="price-date")
        if not st.form_submit_button("Save price", key="price-save"):
            return
    gpu_type = other or gpu
    if not source.strip():
        st.error("Say where the price comes from: every $ figure names its source.")
        return
    known = next((p for p in prices if p.gpu_type == gpu_type and p.kind == kind), None)
    body = {"usd_per_gpu_hour": usd, "source": source.strip(), "date": date.isoformat()}
    if known is None:
        api.create_price({"gpu_type": gpu_type, "kind": kind, **body})
        changed(f"Added the {kind} price of {gpu_type}: ${usd:,.2f}/GPU-h")
    else:
        api.update_price(known.id, body)
        changed(f"Changed the {kind} price of {gpu_type} to ${usd:,.2f}/GPU-h")


def _remove_form(api: AdminClient, prices: list[Price]) -> None:
    if not prices:
        return
    st.subheader("Remove a price")
    labels = {f"{p.gpu_type} {p.kind} (${p.usd_per_gpu_hour:,.2f}/GPU-h)": p.id for p in prices}
    label = st.selectbox("Price", list(labels), key="price-remove")
    if st.button("Remove", key="price-remove-button"):
        api.delete_price(labels[label])
        changed(f"Removed the price {label}")


@shows_api_errors
def render() -> None:
    """The Prices page."""
    st.title("Prices")
    show_flash()
    api = admin_client()
    prices = api.prices()
    in_use = {b.gpu_type for b in api.backends() if b.enabled}
    st.caption(
        "USD per GPU-hour by GPU type and kind. Bills, right-sized bills and capacity costs "
        "use the kind chosen on each page; requests are priced on-demand."
    )
    if prices:
        _table(prices, in_use)
    else:
        st.info("No GPU prices yet: no $ figure can be shown. Set one below.")
    gaps = missing(prices, in_use)
    if gaps:
        st.warning(
            "No price for "
            + "; ".join(f"{g} {k}" for g, k in gaps)
            + ": figures of that kind for those GPUs say 'no price' until one is set."
        )
    if offers_changes(api):
        _set_form(api, prices, in_use)
        _remove_form(api, prices)
