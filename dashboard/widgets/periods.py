"""The periods and price views the pages offer."""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard.schemas import PRICE_KINDS, Price, PriceKind

PERIODS = {"today": 0, "7 days": 7, "30 days": 30}


def period_start(label: str, now: dt.datetime | None = None) -> dt.datetime:
    """When the period called `label` began (today: midnight UTC)."""
    now = now or dt.datetime.now(dt.UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight - dt.timedelta(days=PERIODS[label]) if PERIODS[label] else midnight


def choose_period(key: str) -> tuple[str, dt.datetime]:
    """A period picker; the label chosen and when that period began."""
    label = st.radio("Period", list(PERIODS), index=1, horizontal=True, key=key)
    return label, period_start(label)


def choose_price_kind(key: str) -> PriceKind:
    """The GPU price the $ figures assume (on-demand, reserved or spot)."""
    kind: PriceKind = st.radio("GPU price", PRICE_KINDS, horizontal=True, key=key)
    return kind


def price_note(prices: list[Price], kind: str, gpu_types: set[str]) -> str:
    """The price assumption behind $ figures, e.g. `B200 $5.98/GPU-h on-demand (source, date)`,
    for the GPU types in use."""
    chosen = sorted(
        (p for p in prices if p.kind == kind and p.gpu_type in gpu_types), key=lambda p: p.gpu_type
    )
    if not chosen:
        return f"no {kind} GPU price set for {', '.join(sorted(gpu_types)) or 'any GPU in use'}"
    return "; ".join(
        f"{p.gpu_type} ${p.usd_per_gpu_hour:.2f}/GPU-h {kind} ({p.source}, {p.date})"
        for p in chosen
    )
