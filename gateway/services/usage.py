"""Per-request usage records with the price applied to each: every $ recomputable.

Pages are ordered by record id and continued from a cursor (the last id seen), so a page
never skips or repeats a record while new ones arrive. CSV streams every matching record in
batches of the same query.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.tables import UsageRecord
from gateway.errors import ValidationFailed
from gateway.schemas.reports import UsagePage, UsageRow

CSV_BATCH = 1000


@dataclass(frozen=True)
class UsageFilter:
    """Which records: [start, end), and optionally one model, method, backend, key, status,
    request class, rule, drafter, team, end user, tag and endpoint."""

    start: dt.datetime | None = None
    end: dt.datetime | None = None
    model: str | None = None
    method: str | None = None
    backend: str | None = None
    key: int | None = None
    status: int | None = None
    request_class: str | None = None
    rule: int | None = None
    drafter: str | None = None
    team: int | None = None
    end_user: str | None = None
    tag: str | None = None  # one of its tags
    endpoint: str | None = None

    def query(self, after_id: int, limit: int) -> Select[Any]:
        r = UsageRecord
        query = select(r).where(r.id > after_id).order_by(r.id).limit(limit)
        for column, value in (
            (r.model, self.model),
            (r.method, self.method),
            (r.backend_name, self.backend),
            (r.api_key_id, self.key),
            (r.status_code, self.status),
            (r.request_class, self.request_class),
            (r.rule_index, self.rule),
            (r.drafter, self.drafter),
            (r.team_id, self.team),
            (r.end_user, self.end_user),
            (r.endpoint, self.endpoint),
        ):
            if value is not None:
                query = query.where(column == value)
        if self.tag is not None:  # stored `,a,b,`: a tag holds no comma, `%` or `_` matter
            query = query.where(r.tags.contains(f",{self.tag},", autoescape=True))
        if self.start is not None:
            query = query.where(r.created_at >= self.start)
        if self.end is not None:
            query = query.where(r.created_at < self.end)
        return query


def _after(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit() or len(cursor) > 19:
        message = "cursor must be a next_cursor this endpoint returned"
        raise ValidationFailed(message, param="cursor")
    return int(cursor)


def page(session: Session, where: UsageFilter, cursor: str | None, limit: int) -> UsagePage:
    """Up to `limit` records after `cursor`, oldest first."""
    rows = list(session.scalars(where.query(_after(cursor), limit)))
    more = len(rows) == limit
    return UsagePage(
        data=[row_of(r) for r in rows], next_cursor=str(rows[-1].id) if rows and more else None
    )


def row_of(r: UsageRecord) -> UsageRow:
    uncached = r.prompt_tokens - (r.cached_prompt_tokens or 0)  # a cache hit pays no prefill
    tokens, prompt = r.completion_tokens, uncached * (r.prompt_usd_per_mtok or 0.0) / 1e6
    output = None if r.cost_usd is None else r.cost_usd - prompt  # the output tokens' share
    output_base = None if r.baseline_cost_usd is None else r.baseline_cost_usd - prompt
    return UsageRow(
        id=r.id,
        request_id=r.request_id,
        client_request_id=r.client_request_id,
        created_at=r.created_at,
        api_key_id=r.api_key_id,
        model=r.model,
        method=r.method,
        backend=r.backend_name,
        prompt_tokens=r.prompt_tokens,
        cached_prompt_tokens=r.cached_prompt_tokens,
        completion_tokens=r.completion_tokens,
        status_code=r.status_code,
        outcome=r.outcome,
        latency_ms=r.latency_ms,
        ttft_ms=r.ttft_ms,
        concurrency=r.concurrency,
        usd_per_mtok=None if output is None or not tokens else output * 1e6 / tokens,
        baseline_usd_per_mtok=None
        if output_base is None or not tokens
        else output_base * 1e6 / tokens,
        prompt_usd_per_mtok=r.prompt_usd_per_mtok,
        cost_usd=r.cost_usd,
        baseline_cost_usd=r.baseline_cost_usd,
        curve_source=r.curve_source,
        cost_error_usd=r.cost_error_usd,
        baseline_error_usd=r.baseline_error_usd,
        tokens_estimated=r.tokens_estimated,
        spec_steps=r.spec_steps,
        draft_tokens=r.draft_tokens,
        accepted_tokens=r.accepted_tokens,
        acceptance_length=1 + r.accepted_tokens / r.spec_steps
        if r.spec_steps and r.accepted_tokens is not None
        else None,
        request_class=r.request_class,
        rule=r.rule_index,
        acceptance_factor=r.acceptance_factor,
        drafter=r.drafter,
        drafter_factor=r.drafter_factor,
        context_usd=r.context_usd,
        baseline_context_usd=r.baseline_context_usd,
        team_id=r.team_id,
        end_user=r.end_user,
        tags=r.tags,
        endpoint=r.endpoint,
    )


def csv_lines(sessions: sessionmaker[Session], where: UsageFilter) -> Iterator[str]:
    """The CSV of every matching record: a header, then a line per record, oldest first.

    The first batch is read here, before the response starts, so a filter the database
    refuses (an integer beyond its range) is an error response, not a cut-off download."""
    first = _batch(sessions, where, 0)
    return _csv(sessions, where, first)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet takes for a formula


def _cell(value: object) -> object:
    """A CSV cell: empty for None; text a spreadsheet would run as a formula (a client's
    request id `=HYPERLINK(...)`) behind a quote, as OWASP advises, so it shows as text."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _batch(sessions: sessionmaker[Session], where: UsageFilter, after: int) -> list[UsageRecord]:
    with sessions() as session:
        return list(session.scalars(where.query(after, CSV_BATCH)))


def _csv(
    sessions: sessionmaker[Session], where: UsageFilter, rows: list[UsageRecord]
) -> Iterator[str]:
    columns = list(UsageRow.model_fields)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    while True:
        for r in rows:
            values = row_of(r).model_dump(mode="json")
            writer.writerow(_cell(values[c]) for c in columns)
        yield out.getvalue()
        out.seek(0)
        out.truncate()
        if len(rows) < CSV_BATCH:
            return
        rows = _batch(sessions, where, rows[-1].id)
