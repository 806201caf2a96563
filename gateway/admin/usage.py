"""Admin API for usage: every request's record with the price applied, as JSON or CSV."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from gateway.deps import ComponentsDep, SessionDep
from gateway.schemas.reports import Instant, UsagePage
from gateway.services.usage import UsageFilter, csv_lines, page

router = APIRouter(prefix="/usage", tags=["savings"])


@router.get(
    "",
    response_model=UsagePage,
    responses={200: {"content": {"text/csv": {}}, "description": "JSON page, or CSV"}},
)
def get_usage(
    session: SessionDep,
    components: ComponentsDep,
    start: Annotated[Instant | None, Query(alias="from")] = None,
    end: Annotated[Instant | None, Query(alias="to")] = None,
    model: str | None = None,
    method: str | None = None,
    backend: str | None = None,
    key: int | None = None,
    status: int | None = None,
    request_class: Annotated[str | None, Query(alias="class")] = None,
    rule: int | None = None,
    drafter: Annotated[str | None, Query(max_length=500)] = None,
    team: int | None = None,
    user: Annotated[str | None, Query(max_length=128)] = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    endpoint: Annotated[str | None, Query(max_length=64)] = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    format: Literal["json", "csv"] = "json",
) -> UsagePage | StreamingResponse:
    """Usage records over [from, to), oldest first, with the concurrency, $/1M and curve
    source that priced each, its request class and rule, and who it is attributed to (team,
    end user, tags, endpoint); `format=csv` streams every matching record (no paging)."""
    where = UsageFilter(
        start, end, model, method, backend, key, status, request_class, rule, drafter, team,
        user, tag, endpoint,
    )  # fmt: skip
    if format == "csv":
        headers = {"content-disposition": 'attachment; filename="usage.csv"'}
        lines = csv_lines(components.sessions, where)
        return StreamingResponse(lines, media_type="text/csv", headers=headers)
    return page(session, where, cursor, limit)
