"""Audit entries as people read them: what changed, before → after, and an automatic
move's candidates with their prices."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from dashboard.formats import NO_DATA, usd
from dashboard.schemas import AuditEntry

MOVES = frozenset({"switch", "start"})  # the selector's entries: a move, a replica's first choice
MOVE_STEP = "move_step"  # a step of a gradual move


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested fields as dotted names (lists and scalars are leaves)."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _flat(inner, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), value


def _text(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return NO_DATA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, Mapping) and "when" in value and "method" in value:  # a rule
        k = f" K={value['k']}" if value.get("k") else ""
        return f"({' and '.join(value['when'])} → {value['method']}{k})"
    if isinstance(value, Mapping):
        return "(" + ", ".join(f"{k} {_text(v)}" for k, v in value.items()) + ")"
    return str(value)


def changes(entry: AuditEntry) -> str:
    """Each field that differs, `name: before → after`; a creation or removal as its fields."""
    if entry.action in MOVES:
        return _move(entry)
    if entry.action == MOVE_STEP:
        return _step(entry)
    before = dict(_flat(entry.before or {}))
    after = dict(_flat(entry.after or {}))
    names = [n for n in {**before, **after} if before.get(n) != after.get(n)]
    if not before or not after:  # created or removed: what it was
        shown = after or before
        return "; ".join(f"{n}: {_text(shown[n])}" for n in shown if shown[n] not in (None, []))
    return "; ".join(f"{n}: {_text(before.get(n))} → {_text(after.get(n))}" for n in names)


def _move(entry: AuditEntry) -> str:
    after = entry.after or {}
    source = (entry.before or {}).get("method")
    where = after.get("request_class")
    whose = f" (class {where}, {after.get('objective', 'cost')})" if where else ""
    load = after.get("concurrency")
    at = f" at {load:g} streams" if isinstance(load, int | float) else ""
    if entry.action == "start":
        return f"serving {after.get('method')}{whose}{at} (this replica's first choice)"
    return f"method: {source or NO_DATA} → {after.get('method')}{whose}{at}"


def _step(entry: AuditEntry) -> str:
    after = entry.after or {}
    share = after.get("target_share")
    part = f"{share:.0%}" if isinstance(share, int | float) else NO_DATA
    source = (entry.before or {}).get("method") or NO_DATA
    return (
        f"step {after.get('step')}: {part} of the traffic on {after.get('method')} (from {source})"
    )


def candidates(entry: AuditEntry) -> list[dict[str, str]]:
    """An automatic move's candidates: each method's $/1M output tokens and per-token
    latency at the load it was made at, the chosen one marked."""
    after = entry.after or {}
    prices: Mapping[str, float] = after.get("usd_per_mtok") or {}
    latency: Mapping[str, float] = after.get("itl_ms") or {}
    return [
        {
            "method": method,
            "$ per 1M output tokens": usd(price),
            "per-token latency": f"{latency[method]:.1f} ms" if method in latency else NO_DATA,
            "chosen": "yes" if method == after.get("method") else "",
        }
        for method, price in sorted(prices.items(), key=lambda item: item[1])
    ]


def audit_rows(entries: list[AuditEntry]) -> list[dict[str, str]]:
    """The entries as table rows, newest first as the API lists them."""
    return [
        {
            "at": f"{e.at:%Y-%m-%d %H:%M:%S} UTC",
            "by": e.actor,
            "action": e.action,
            "change": changes(e),
        }
        for e in entries
    ]
