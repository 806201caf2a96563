"""Models and their policies: audited changes and the public shape."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import ModelPolicy
from gateway.errors import Conflict, validation_failed
from gateway.policy.moves import move_record, stored_move
from gateway.schemas.resources import ModelCreate, ModelPublic, MovePublic, Policy


def policy_of(row: ModelPolicy) -> Policy:
    """The policy stored on a model row."""
    return Policy(
        mode=row.mode,
        method=row.method,
        k=row.k,
        itl_objective_ms=row.itl_objective_ms,
        explore_fraction=row.explore_fraction,
        rules=row.rules or [],
        classes=row.classes or {},
        drafter_trial=row.drafter_trial,
        lossless_quarantine=row.lossless_quarantine,
    )


def model_public(row: ModelPolicy, now: float | None = None) -> ModelPublic:
    """A model as the API shows it, with its gradual move if one is under way."""
    return ModelPublic(
        name=row.name,
        policy=policy_of(row),
        move=move_public(row, time.time() if now is None else now),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def move_public(row: ModelPolicy, now: float) -> MovePublic | None:
    """The row's move toward its pinned method, unless it is over."""
    move = stored_move(row.move, row.method) if row.mode == "pinned" else None
    if move is None or move.done(now):
        return None
    return MovePublic(
        source=move.source,
        target=move.target,
        started_at=dt.datetime.fromtimestamp(move.started, dt.UTC),
        step_share=move.step_share,
        step_s=move.step_s,
        target_share=move.share(now),
        ends_at=dt.datetime.fromtimestamp(move.started + move.duration_s, dt.UTC),
    )


def _snapshot(row: ModelPolicy) -> dict[str, Any]:
    snapshot = {"name": row.name, "policy": policy_of(row).model_dump(mode="json")}
    if row.move:
        snapshot["move"] = row.move
    return snapshot


def _assign(row: ModelPolicy, policy: Policy) -> None:
    for key, value in policy.model_dump().items():
        setattr(row, key, value)


def create_model(session: Session, data: ModelCreate, actor: str) -> ModelPolicy:
    """Add a model with its policy."""
    row = ModelPolicy(name=data.name)
    _assign(row, data.policy)
    queries.add(session, row, f"model {data.name!r}")
    queries.record_audit(
        session,
        actor=actor,
        action="create",
        resource=("model", row.name),
        before=None,
        after=_snapshot(row),
    )
    return row


def ensure_model(session: Session, name: str, actor: str) -> ModelPolicy:
    """The model called `name`, created with the default policy if it is new."""
    row = queries.find_model(session, name)
    return row or create_model(session, ModelCreate(name=name), actor)


def policy_warnings(session: Session, name: str, policy: Policy) -> list[str]:
    """What in a policy no enabled backend of the model serves: a pinned method or K, or a
    rule's, that requests would ask for and fall back from, or a trial's drafter. Saved all
    the same: the backend may be on its way."""
    enabled = [b for b in queries.list_backends(session, name) if b.enabled]
    served = {(b.method, b.k) for b in enabled}
    asks = [("pinned", policy.method, policy.k)] if policy.mode == "pinned" else []
    asks += [(f"rule {i + 1}", r.method, r.k) for i, r in enumerate(policy.rules)]
    warnings = [
        _unserved(name, what, method, k, served)
        for what, method, k in asks
        if method is not None and not _serves(served, method, k)
    ]
    trial = policy.drafter_trial
    if trial is not None and trial.drafter not in {b.drafter for b in enabled}:
        warnings.append(
            f"drafter_trial: no enabled backend of {name} runs drafter {trial.drafter!r}; "
            "its method's requests go to its other backends until one does"
        )
    return warnings


def _serves(served: set[tuple[str, int | None]], method: str, k: int | None) -> bool:
    return any(m == method and (k is None or bk == k) for m, bk in served)


def _unserved(
    name: str, what: str, method: str, k: int | None, served: set[tuple[str, int | None]]
) -> str:
    ks = sorted(bk for m, bk in served if m == method and bk is not None)
    if _serves(served, method, None):  # the method runs, at other K
        runs = ", ".join(f"K={bk}" for bk in ks) or "its default K"
        return (
            f"{what}: no enabled backend of {name} runs {method} at K={k} (it runs at "
            f"{runs}); its requests go to those"
        )
    return (
        f"{what}: no enabled backend of {name} runs {method}; its requests go to the "
        "other methods' backends until one does"
    )


def set_policy(
    session: Session,
    name: str,
    policy: Policy,
    actor: str,
    *,
    auto_method: str | None = None,
    steps: tuple[float, float] | None = None,
) -> ModelPolicy:
    """Replace a model's policy, creating the model if it is new.

    Pinning another method than the one serving now (the pinned one, or `auto_method` for
    an auto model) starts a gradual move in `steps` (share per step, seconds between);
    without `steps` the move is immediate.
    """
    row = queries.find_model(session, name)
    if row is None:
        try:
            model = ModelCreate(name=name, policy=policy)
        except ValidationError as exc:  # the name comes from the path, unchecked so far
            raise validation_failed(exc.errors()) from None
        return create_model(session, model, actor)
    before = _snapshot(row)
    serving = row.method if row.mode == "pinned" else auto_method
    same = (row.mode, row.method) == (policy.mode, policy.method)
    kept = row.move if same and steps is not None else None  # immediate: a move ends now
    _assign(row, policy)
    row.move = kept
    repinned = policy.mode == "pinned" and serving != policy.method
    if repinned and serving is not None and steps is not None and steps[0] < 1:
        row.move = move_record(serving, time.time(), *steps)
    session.flush()
    queries.record_audit(
        session,
        actor=actor,
        action="update",
        resource=("model", name),
        before=before,
        after=_snapshot(row),
    )
    return row


def delete_model(session: Session, name: str, actor: str) -> None:
    """Remove a model that no backend serves any more."""
    row = queries.get_model(session, name)
    serving = queries.list_backends(session, model=name)
    if serving:
        names = ", ".join(b.name for b in serving)
        raise Conflict(f"model {name!r} is served by backends {names}; remove them first")
    before = _snapshot(row)
    session.delete(row)
    session.flush()
    queries.record_audit(
        session, actor=actor, action="delete", resource=("model", name), before=before, after=None
    )


def record_move_step(
    session: Session, model: str, source: str, target: str, step: int, share: float, actor: str
) -> None:
    """Audit one step of a gradual move: the target's share of the traffic from now on."""
    queries.record_audit(
        session,
        actor=actor,
        action="move_step",
        resource=("model", model),
        before={"method": source},
        after={"method": target, "step": step, "target_share": round(share, 4)},
    )


def record_method_switch(
    session: Session,
    model: str,
    before: str | None,
    after: str,
    concurrency: float,
    usd_per_mtok: Mapping[str, float],
    actor: str,
    *,
    itl_ms: Mapping[str, float] | None = None,
    request_class: str | None = None,
    objective: str = "cost",
    reason: str = "load",
) -> None:
    """Audit an automatic move of a model (or of one of its request classes) to another
    method, with the load and every candidate's $/1M output tokens and ITL behind it.
    `reason` is `load` for a move (action `switch`), `start` for the first choice a gateway
    replica makes (action `start`, `before` what routing served until then: plain, or the
    first method by name)."""
    entry: dict[str, Any] = {
        "method": after,
        "reason": reason,
        "concurrency": round(concurrency, 2),
        "usd_per_mtok": {m: round(v, 6) for m, v in usd_per_mtok.items()},
    }
    if itl_ms:
        entry["itl_ms"] = {m: round(v, 3) for m, v in itl_ms.items()}
    if request_class is not None:
        entry |= {"request_class": request_class, "objective": objective}
    queries.record_audit(
        session,
        actor=actor,
        action="switch" if reason == "load" else "start",
        resource=("model", model),
        before={"method": before},
        after=entry,
    )
