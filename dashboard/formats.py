"""How the dashboard writes values: one glyph for a missing one, units and precision."""

from __future__ import annotations

NO_DATA = "—"  # nothing measured, not applicable, or not set: never a made-up figure


def usd(value: float | None) -> str:
    """Dollars at a precision that keeps small amounts readable: $1,234.56, $0.0123."""
    if value is None:
        return NO_DATA
    if abs(value) >= 100:
        return f"${value:,.0f}"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}" if abs(value) >= 1e-4 or value == 0 else f"${value:.2e}"


def count(value: float | None) -> str:
    """A whole number with thousands separators."""
    return NO_DATA if value is None else f"{value:,.0f}"


def ms(value: float | None) -> str:
    """Milliseconds, one decimal."""
    return NO_DATA if value is None else f"{value:,.1f} ms"


def ratio(value: float | None) -> str:
    """A speedup or other ratio: 1.37x."""
    return NO_DATA if value is None else f"{value:.2f}x"


def share(value: float | None) -> str:
    """A fraction as a percentage: small but nonzero ones are not rounded to 0%."""
    if value is None:
        return NO_DATA
    if value <= 0:
        return "0%"
    return "<0.01%" if value < 1e-4 else f"{value:.2%}"


def or_missing(value: object) -> str:
    """The value as text, or the missing glyph for None and empty strings (a table column
    holds one type: text, when any of its cells can be missing)."""
    return NO_DATA if value is None or value == "" else str(value)


def money(usd: float | None) -> str:
    """Dollars to the cent, or "no price"."""
    if usd is None:
        return "no price"
    return f"-${-usd:,.2f}" if usd < 0 else f"${usd:,.2f}"


def usd_interval(usd: tuple[float, float] | None, digits: int = 2) -> str:
    """A 95% interval of dollars, or why there is none."""
    if usd is None:
        return "95%: too little data to bound"
    low, high = (f"{'-' if x < 0 else ''}${abs(x):,.{digits}f}" for x in usd)
    return f"95%: {low} to {high}"
