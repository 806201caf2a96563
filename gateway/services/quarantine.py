"""Quarantines: a method whose greedy answers diverge, taken out of a model's `auto` choices.

For a model whose policy asks for it (`lossless_quarantine`), a method is quarantined once
its checks against the reference method (docs/lossless.md) since it was last lifted, within
the last day, number at least `min_checks` and the lower end of their divergence rate's 95%
Wilson interval is above `threshold` and above the upper end of the floor's (the reference
against itself over the same time, where it has been measured): the watchdog is confident
the method changes more answers than that, and more than the engine's own nondeterminism
does, not merely unlucky. Each quarantine is audited (actor
`lossless-watchdog`) with its evidence: the counts, the rate and its interval, the
threshold, and the model's floor (the reference against itself) over the same checks. It
stays until an admin lifts it (audited too); checks before the lift no longer count.

A quarantine steers `auto` only: the selector leaves the method and does not come back, and
exploration and spill pass it by. A pinned method or a rule's is never overridden: it is
quarantined all the same, so the report and the audit say so, and the alert fires.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.base import utcnow
from gateway.db.tables import LosslessCheck, ModelPolicy, Quarantine
from gateway.errors import Conflict, NotFound
from gateway.services.lossless import wilson_interval

ACTOR = "lossless-watchdog"
WINDOW = dt.timedelta(days=1)  # the checks a verdict reads, at most


def active(session: Session, model: str | None = None) -> list[Quarantine]:
    """Quarantines not lifted, oldest first (one model's, or every model's)."""
    query = select(Quarantine).where(Quarantine.lifted_at.is_(None)).order_by(Quarantine.id)
    if model is not None:
        query = query.where(Quarantine.model == model)
    return list(session.scalars(query))


def listed(session: Session, model: str | None, include_lifted: bool) -> list[Quarantine]:
    """Quarantines, newest first; lifted ones only when asked."""
    query = select(Quarantine).order_by(Quarantine.id.desc())
    if model is not None:
        query = query.where(Quarantine.model == model)
    if not include_lifted:
        query = query.where(Quarantine.lifted_at.is_(None))
    return list(session.scalars(query))


def quarantine_due(
    session: Session, threshold: float, min_checks: int, now: dt.datetime | None = None
) -> list[Quarantine]:
    """Quarantine every method the evidence now condemns; the new quarantines."""
    now = now or utcnow()
    guarded = select(ModelPolicy.name).where(ModelPolicy.lossless_quarantine)
    made: list[Quarantine] = []
    for model in session.scalars(guarded):
        held = {q.method for q in active(session, model)}
        for method, evidence in _evidence(session, model, now).items():
            if method in held or evidence["samples"] < min_checks:
                continue
            if evidence["interval_95"][0] <= max(threshold, evidence["floor"]["interval_95"][1]):
                continue  # not surely over the threshold, or over the engine's own noise
            made.append(_quarantine(session, model, method, evidence | {"threshold": threshold}))
    return made


def _evidence(session: Session, model: str, now: dt.datetime) -> dict[str, dict[str, Any]]:
    """Per method served against another, its checks since its last lift (within the
    window): counts, rate, interval, the reference, and the model's floor since then."""
    c = LosslessCheck
    lifts = dict(
        session.execute(
            select(Quarantine.method, func.max(Quarantine.lifted_at))
            .where(Quarantine.model == model, Quarantine.lifted_at.is_not(None))
            .group_by(Quarantine.method)
        ).all()
    )
    counts = select(
        c.method, c.reference_method, func.count(), func.sum(case((c.diverged, 1), else_=0))
    )
    since = now - WINDOW
    found: dict[str, dict[str, Any]] = {}
    rows = session.execute(
        counts.where(c.model == model, c.created_at >= since)
        .group_by(c.method, c.reference_method)
    ).all()  # fmt: skip
    for method, reference, _, _ in rows:
        start = max(since, lifts.get(method) or since)
        n, d = _count(session, model, start, method=method, reference=reference)
        if method == reference or not n:
            continue
        floor = _count(session, model, start, reference=reference, floor=True)
        found[method] = {
            "samples": n,
            "divergences": d,
            "divergence_rate": d / n,
            "interval_95": list(wilson_interval(d, n)),
            "reference_method": reference,
            "checks_since": start.isoformat(),
            "floor": {
                "samples": floor[0],
                "divergences": floor[1],
                # no floor measured yet: no bound from it (0 to 0)
                "interval_95": list(wilson_interval(floor[1], floor[0])) if floor[0] else [0, 0],
            },
        }
    return found


def _count(
    session: Session,
    model: str,
    start: dt.datetime,
    *,
    reference: str,
    method: str | None = None,
    floor: bool = False,
) -> tuple[int, int]:
    """Checks and divergences of `method` (or the floor: the reference against itself)
    against `reference` since `start`."""
    c = LosslessCheck
    query = select(func.count(), func.sum(case((c.diverged, 1), else_=0))).where(
        c.model == model, c.created_at >= start, c.reference_method == reference
    )
    query = query.where(c.method == (reference if floor else method))
    n, d = session.execute(query).one()
    return int(n), int(d or 0)


def _quarantine(session: Session, model: str, method: str, evidence: dict[str, Any]) -> Quarantine:
    row = Quarantine(model=model, method=method, evidence=evidence)
    session.add(row)
    session.flush()
    queries.record_audit(
        session,
        actor=ACTOR,
        action="quarantine",
        resource=("quarantine", f"{model}:{method}"),
        before=None,
        after={"id": row.id, "model": model, "method": method, **evidence},
    )
    return row


def lift(session: Session, quarantine_id: int, actor: str) -> Quarantine:
    """Lift a quarantine: `auto` may choose the method again, judged by later checks only."""
    row = session.get(Quarantine, quarantine_id)
    if row is None:
        raise NotFound(f"quarantine {quarantine_id} not found")
    if row.lifted_at is not None:
        raise Conflict(f"quarantine {quarantine_id} was lifted at {row.lifted_at.isoformat()}")
    row.lifted_at, row.lifted_by = utcnow(), actor
    session.flush()
    queries.record_audit(
        session,
        actor=actor,
        action="lift",
        resource=("quarantine", f"{row.model}:{row.method}"),
        before={"id": row.id, "active": True},
        after={"id": row.id, "active": False},
    )
    return row
