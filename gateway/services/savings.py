"""Savings: capacity cost against plain decoding per group, over any period, exactly.

Whole hours are read from the hourly rollups; the partial hours at either edge of the
period from the records themselves, so `from=07:05` counts a request at 07:06 and never one
at 07:04. Requests refused before any backend served them (a bad key, a limit, a malformed
body) are counted apart as `refused`, never among a model's `requests`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

from gateway.acceptance import Acceptance
from gateway.db.tables import UsageHourly, UsageRecord
from gateway.errors import ValidationFailed
from gateway.rollups import hour_of
from gateway.schemas.reports import SavingsReport, SavingsRow

GROUPS = (
    "model", "method", "key", "backend", "class", "rule", "drafter", "team", "user", "tags",
    "endpoint",
)  # fmt: skip
# a group's name in the rows, where it is not its own
FIELDS = {"class": "request_class", "user": "end_user"}
# what a rollup holds for none
NONE = {"class": "", "rule": -1, "drafter": "", "team": 0, "user": "", "tags": "", "endpoint": ""}
DEFAULT_PERIOD = dt.timedelta(days=30)
HOUR = dt.timedelta(hours=1)
# Summed per group, in records and rollups alike, after the served and refused counts.
SUMMED = (
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "baseline_cost_usd",
    "cost_error_usd",
    "baseline_error_usd",
    "cached_prompt_tokens",
    "prefill_saved_by_cache_usd",
    "spec_steps",
    "accepted_tokens",
    "spec_requests",
    "accepted_sq",
    "accepted_steps",
    "steps_sq",
)


def _groups(group_by: str) -> list[str]:
    names = [g.strip() for g in group_by.split(",") if g.strip()]
    unknown = [g for g in names if g not in GROUPS]
    if unknown:
        raise ValidationFailed(
            f"group_by accepts {', '.join(GROUPS)}; got {', '.join(unknown)}", param="group_by"
        )
    return names


def _rollup_sums(names: Sequence[str], start: dt.datetime, end: dt.datetime) -> Any:
    """Per group, the sums of the whole hours in [start, end) (both on the hour)."""
    h = UsageHourly
    dims = {
        "model": h.model,
        "method": h.method,
        "key": h.api_key_id,
        "backend": h.backend_name,
        "class": h.request_class,
        "rule": h.rule_index,
        "drafter": h.drafter,
        "team": h.team_id,
        "user": h.end_user,
        "tags": h.tags,
        "endpoint": h.endpoint,
    }
    served = h.backend_name != ""
    return _sums(
        [dims[n] for n in names],
        func.sum(case((served, h.requests), else_=0)),
        func.sum(case((served, 0), else_=h.requests)),
        [getattr(h, name) for name in SUMMED],
    ).where(h.hour >= start, h.hour < end)


def _record_sums(names: Sequence[str], start: dt.datetime, end: dt.datetime) -> Any:
    """Per group, the sums of the records in [start, end), grouped as the rollups are."""
    r = UsageRecord
    backend = func.coalesce(r.backend_name, "")
    dims = {
        "model": r.model,
        "method": func.coalesce(r.method, ""),
        "key": func.coalesce(r.api_key_id, 0),
        "backend": backend,
        "class": func.coalesce(r.request_class, ""),
        "rule": func.coalesce(r.rule_index, -1),
        "drafter": func.coalesce(r.drafter, ""),
        "team": func.coalesce(r.team_id, 0),
        "user": func.coalesce(r.end_user, ""),
        "tags": func.coalesce(r.tags, ""),
        "endpoint": func.coalesce(r.endpoint, ""),
    }
    served = backend != ""
    saved = r.cached_prompt_tokens * r.prompt_usd_per_mtok / 1e6  # NULL unpriced: not summed
    reported = (r.spec_steps > 0) & r.accepted_tokens.is_not(None)
    accepted, steps = r.accepted_tokens * 1.0, r.spec_steps * 1.0  # floats: no overflow
    columns = {
        "prefill_saved_by_cache_usd": saved,
        "spec_requests": case((reported, 1), else_=0),
        "accepted_sq": accepted * accepted,
        "accepted_steps": accepted * steps,
        "steps_sq": steps * steps,
    }
    return _sums(
        [dims[n] for n in names],
        func.sum(case((served, 1), else_=0)),
        func.sum(case((served, 0), else_=1)),
        [columns.get(name, getattr(r, name, None)) for name in SUMMED],
    ).where(r.created_at >= start, r.created_at < end)


def _sums(
    dims: list[Any],
    requests: ColumnElement[Any],
    refused: ColumnElement[Any],
    columns: list[Any],
) -> Any:
    return select(*dims, requests, refused, *(func.sum(c) for c in columns)).group_by(*dims)


def _row(names: Sequence[str], group: tuple[Any, ...], sums: list[float]) -> SavingsRow:
    requests, refused, prompt, completion, cost, baseline, cost_error, baseline_error = sums[:8]
    cached, saved_by_cache, steps, accepted = sums[8:12]
    acceptance = Acceptance(int(sums[12]), steps, accepted, *sums[13:16])
    dims = {
        FIELDS.get(n, n): None if v == NONE.get(n) else v for n, v in zip(names, group, strict=True)
    }
    return SavingsRow(
        **dims,
        requests=int(requests),
        refused=int(refused),
        prompt_tokens=int(prompt),
        completion_tokens=int(completion),
        cost_usd=cost,
        baseline_cost_usd=baseline,
        savings_usd=baseline - cost,
        cost_usd_95=_interval(cost, cost_error),
        baseline_cost_usd_95=_interval(baseline, baseline_error),
        savings_usd_95=_interval(baseline - cost, cost_error + baseline_error),
        cached_prompt_tokens=int(cached),
        prefill_saved_by_cache_usd=saved_by_cache,
        spec_requests=acceptance.requests,
        spec_steps=int(steps),
        accepted_tokens=int(accepted),
        acceptance_length=acceptance.length,
        acceptance_length_95=acceptance.interval_95(),
    )


def _interval(value: float, half_width: float) -> tuple[float, float]:
    return value - half_width, value + half_width


def savings(
    session: Session, start: dt.datetime | None, end: dt.datetime | None, group_by: str
) -> SavingsReport:
    """Tokens, cost, plain-decoding baseline and savings per group over [start, end)."""
    names = _groups(group_by)
    end = (end or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    start = (start or end - DEFAULT_PERIOD).astimezone(dt.UTC)
    first_hour = hour_of(start) if hour_of(start) == start else hour_of(start) + HOUR
    last_hour = hour_of(end)
    queries = [_record_sums(names, start, end)]
    if first_hour < last_hour:  # whole hours inside: rollups, and records at either edge
        queries = [
            _rollup_sums(names, first_hour, last_hour),
            _record_sums(names, start, first_hour),
            _record_sums(names, last_hour, end),
        ]
    totals: dict[tuple[Any, ...], list[float]] = {}
    for query in queries:
        for row in session.execute(query):
            group = tuple(row[: len(names)])
            sums = totals.setdefault(group, [0.0] * (2 + len(SUMMED)))
            for i, value in enumerate(row[len(names) :]):
                sums[i] += float(value or 0)
    rows = [_row(names, group, sums) for group, sums in sorted(totals.items())]
    return SavingsReport(start=start.isoformat(), end=end.isoformat(), group_by=names, data=rows)
