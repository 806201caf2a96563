"""Savings: capacity cost against plain decoding per group, from the hourly rollups only."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db.tables import UsageHourly
from gateway.errors import ValidationFailed
from gateway.reports import SavingsReport, SavingsRow

GROUPS = {
    "model": UsageHourly.model,
    "method": UsageHourly.method,
    "key": UsageHourly.api_key_id,
    "backend": UsageHourly.backend_name,
}
DEFAULT_PERIOD = dt.timedelta(days=30)


def _groups(group_by: str) -> list[str]:
    names = [g.strip() for g in group_by.split(",") if g.strip()]
    unknown = [g for g in names if g not in GROUPS]
    if unknown:
        raise ValidationFailed(
            f"group_by accepts {', '.join(GROUPS)}; got {', '.join(unknown)}", param="group_by"
        )
    return names


def savings(
    session: Session, start: dt.datetime | None, end: dt.datetime | None, group_by: str
) -> SavingsReport:
    """Tokens, cost, plain-decoding baseline and savings per group over [start, end)."""
    names = _groups(group_by)
    end = (end or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    start = (start or end - DEFAULT_PERIOD).astimezone(dt.UTC)
    columns = [GROUPS[n] for n in names]
    query = (
        select(
            *columns,
            func.sum(UsageHourly.requests),
            func.sum(UsageHourly.prompt_tokens),
            func.sum(UsageHourly.completion_tokens),
            func.sum(UsageHourly.cost_usd),
            func.sum(UsageHourly.baseline_cost_usd),
        )
        .where(UsageHourly.hour >= start, UsageHourly.hour < end)
        .group_by(*columns)
        .order_by(*columns)
    )
    rows = []
    for row in session.execute(query):
        dims = row[: len(names)]
        totals = [float(v or 0) for v in row[len(names) :]]  # type: ignore[arg-type]
        requests, prompt, completion, cost, baseline = totals
        rows.append(
            SavingsRow(
                **dict(zip(names, dims, strict=True)),
                requests=int(requests),
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
                cost_usd=cost,
                baseline_cost_usd=baseline,
                savings_usd=baseline - cost,
            )
        )
    return SavingsReport(start=start.isoformat(), end=end.isoformat(), group_by=names, data=rows)
