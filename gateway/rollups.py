"""The hourly rollups of the usage ledger: one row per hour and every dimension a report
groups by (model, method, backend, key, request class, rule, drafter, team, end user, tags,
endpoint), summed. A record is added to them in the transaction that inserts it
(gateway/accounting.py `write_batch`); `recompute_hour` rebuilds an hour's rows from the
records, for repairs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from gateway.db.session import upsert_insert
from gateway.db.tables import UsageHourly, UsageRecord

if TYPE_CHECKING:
    from gateway.ledger_entry import UsageEntry


def prefill_saved_by_cache_usd(entry: UsageEntry) -> float:
    """The prefill its cache hits skipped, at the prompt price it was given (0 unpriced)."""
    if not entry.cached_prompt_tokens or entry.prompt_usd_per_mtok is None:
        return 0.0
    return entry.cached_prompt_tokens * entry.prompt_usd_per_mtok / 1e6


def hour_of(moment: dt.datetime) -> dt.datetime:
    """The UTC hour a moment falls in."""
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


# _rollup_key's order
ROLLUP_KEY = [
    "hour", "model", "method", "backend_name", "api_key_id", "request_class", "rule_index",
    "drafter", "team_id", "end_user", "tags", "endpoint",
]  # fmt: skip
ROLLUP_VALUES = [
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "baseline_cost_usd",
    "busy_s",
    "cost_error_usd",
    "baseline_error_usd",
    "cached_prompt_tokens",
    "prefill_saved_by_cache_usd",
    "spec_steps",
    "draft_tokens",
    "accepted_tokens",
    "spec_requests",
    "accepted_sq",
    "accepted_steps",
    "steps_sq",
]
RollupKey = tuple[dt.datetime, str, str, str, int, str, int, str, int, str, str, str]


def _rollup_key(e: UsageEntry) -> RollupKey:
    rule = -1 if e.rule_index is None else e.rule_index
    method, backend, key = e.method or "", e.backend_name or "", e.api_key_id or 0
    hour, kind = hour_of(e.created_at), e.request_class or ""
    attributed = e.team_id or 0, e.end_user or "", e.tags or "", e.endpoint or ""
    return hour, e.model, method, backend, key, kind, rule, e.drafter or "", *attributed


def add_to_rollups(session: Session, entries: list[UsageEntry]) -> None:
    """Increment the hourly rollup rows by these (newly inserted) records."""
    sums: dict[RollupKey, list[float]] = {}
    for e in entries:
        total = sums.setdefault(_rollup_key(e), [0] * len(ROLLUP_VALUES))
        total[0] += 1
        total[1] += e.status_code >= 400
        total[2] += e.prompt_tokens
        total[3] += e.completion_tokens
        total[4] += e.cost_usd or 0.0
        total[5] += e.baseline_cost_usd or 0.0
        total[6] += e.latency_ms / 1000
        total[7] += e.cost_error_usd or 0.0
        total[8] += e.baseline_error_usd or 0.0
        total[9] += e.cached_prompt_tokens or 0
        total[10] += prefill_saved_by_cache_usd(e)
        total[11] += e.spec_steps or 0
        total[12] += e.draft_tokens or 0
        total[13] += e.accepted_tokens or 0
        if e.spec_steps and e.accepted_tokens is not None:  # a step or more: a sample
            steps, accepted = e.spec_steps, e.accepted_tokens
            total[14] += 1
            total[15] += accepted * accepted
            total[16] += accepted * steps
            total[17] += steps * steps
    rows = [
        dict(zip(ROLLUP_KEY, key, strict=True)) | dict(zip(ROLLUP_VALUES, values, strict=True))
        for key, values in sums.items()
    ]
    table = UsageHourly.__table__
    statement = upsert_insert(session, table)
    statement = statement.on_conflict_do_update(
        index_elements=ROLLUP_KEY,
        set_={name: table.c[name] + statement.excluded[name] for name in ROLLUP_VALUES},
    )
    session.execute(statement, rows)


def recompute_hour(session: Session, hour: dt.datetime) -> None:
    """Set the hourly rollup rows of `hour` from the usage records (idempotent). Never for
    an hour older than `usage_retention_days`: its records are pruned, its rollups are not."""
    rows = [_rollup_row(hour, group) for group in session.execute(_sums_of_hour(hour))]
    if rows:
        statement = upsert_insert(session, UsageHourly)
        statement = statement.on_conflict_do_update(
            index_elements=ROLLUP_KEY,
            set_={name: getattr(statement.excluded, name) for name in ROLLUP_VALUES},
        )
        session.execute(statement, rows)


def _sums_of_hour(hour: dt.datetime) -> Select[*tuple[Any, ...]]:
    """The usage records of `hour` summed per rollup row: its dimensions (method, backend,
    key, class, rule, drafter, model, team, end user, tags, endpoint), then its values in
    `ROLLUP_VALUES`' order."""
    end = hour + dt.timedelta(hours=1)
    r = UsageRecord
    # The same expression objects in SELECT and GROUP BY, so PostgreSQL sees one expression.
    dimensions = (
        func.coalesce(r.method, ""),
        func.coalesce(r.backend_name, ""),
        func.coalesce(r.api_key_id, 0),
        func.coalesce(r.request_class, ""),
        func.coalesce(r.rule_index, -1),
        func.coalesce(r.drafter, ""),
        r.model,
        func.coalesce(r.team_id, 0),
        func.coalesce(r.end_user, ""),
        func.coalesce(r.tags, ""),
        func.coalesce(r.endpoint, ""),
    )
    reported = (r.spec_steps > 0) & r.accepted_tokens.is_not(None)
    accepted, steps = r.accepted_tokens * 1.0, r.spec_steps * 1.0  # floats: no overflow
    return (
        select(
            *dimensions,
            func.count(),
            func.sum(case((r.status_code >= 400, 1), else_=0)),
            func.sum(r.prompt_tokens),
            func.sum(r.completion_tokens),
            func.coalesce(func.sum(r.cost_usd), 0.0),
            func.coalesce(func.sum(r.baseline_cost_usd), 0.0),
            func.coalesce(func.sum(r.latency_ms), 0.0) / 1000,
            func.coalesce(func.sum(r.cost_error_usd), 0.0),
            func.coalesce(func.sum(r.baseline_error_usd), 0.0),
            func.coalesce(func.sum(r.cached_prompt_tokens), 0),
            func.coalesce(func.sum(r.cached_prompt_tokens * r.prompt_usd_per_mtok / 1e6), 0.0),
            func.coalesce(func.sum(r.spec_steps), 0),
            func.coalesce(func.sum(r.draft_tokens), 0),
            func.coalesce(func.sum(r.accepted_tokens), 0),
            func.sum(case((reported, 1), else_=0)),
            func.coalesce(func.sum(accepted * accepted), 0.0),
            func.coalesce(func.sum(accepted * steps), 0.0),
            func.coalesce(func.sum(steps * steps), 0.0),
        )
        .where(r.created_at >= hour, r.created_at < end)
        .group_by(*dimensions)
    )


def _rollup_row(hour: dt.datetime, group: Sequence[Any]) -> dict[str, Any]:
    """One row of `_sums_of_hour` as the rollup row of `hour` it sets."""
    (
        method, backend, key, request_class, rule, drafter, model, team, user, tags, endpoint,
        n, errors, prompt, completion, cost, baseline, busy, cost_error, baseline_error, cached,
        saved, spec_steps, drafted, accepted, spec_requests, accepted_sq, accepted_steps,
        steps_sq,
    ) = group  # fmt: skip
    return {
        "hour": hour,
        "team_id": team,
        "end_user": user,
        "tags": tags,
        "endpoint": endpoint,
        "method": method,
        "backend_name": backend,
        "api_key_id": key,
        "request_class": request_class,
        "rule_index": rule,
        "drafter": drafter,
        "model": model,
        "requests": n,
        "errors": errors or 0,
        "prompt_tokens": prompt or 0,
        "completion_tokens": completion or 0,
        "cost_usd": cost,
        "baseline_cost_usd": baseline,
        "busy_s": busy,
        "cost_error_usd": cost_error,
        "baseline_error_usd": baseline_error,
        "cached_prompt_tokens": cached,
        "prefill_saved_by_cache_usd": saved,
        "spec_steps": spec_steps,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "spec_requests": spec_requests or 0,
        "accepted_sq": accepted_sq,
        "accepted_steps": accepted_steps,
        "steps_sq": steps_sq,
    }
