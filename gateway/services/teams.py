"""Teams: groups of keys that spend as one, usage attributed to each; audited changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import ApiKey, Team
from gateway.errors import Conflict, NotFound
from gateway.schemas.teams import TeamCreate, TeamPublic, TeamUpdate
from gateway.services.changes import merged


def get_team(session: Session, team_id: int) -> Team:
    """The team with this id."""
    row = session.get(Team, team_id)
    if row is None:
        raise NotFound(f"Team {team_id} not found", param="team_id")
    return row


def public(session: Session, row: Team) -> TeamPublic:
    """A team as the API shows it, with its count of active keys."""
    keys = session.scalar(
        select(func.count()).where(ApiKey.team_id == row.id, ApiKey.revoked_at.is_(None))
    )
    return TeamPublic.model_validate(row).model_copy(update={"keys": keys or 0})


def list_teams(session: Session) -> list[TeamPublic]:
    """Every team, by name."""
    rows: Sequence[Team] = session.scalars(select(Team).order_by(Team.name)).all()
    return [public(session, row) for row in rows]


def _audit(
    session: Session, actor: str, action: str, row: Team, before: dict[str, Any] | None
) -> None:
    after = None if action == "delete" else public(session, row).model_dump(mode="json")
    queries.record_audit(
        session,
        actor=actor,
        action=action,
        resource=("team", str(row.id)),
        before=before,
        after=after,
    )


def create_team(session: Session, data: TeamCreate, actor: str) -> TeamPublic:
    row = queries.add(session, Team(**data.model_dump()), f"Team {data.name!r}")
    _audit(session, actor, "create", row, None)
    return public(session, row)


def update_team(session: Session, team_id: int, patch: TeamUpdate, actor: str) -> TeamPublic:
    """Change a team's name or limits."""
    row = get_team(session, team_id)
    before = public(session, row).model_dump(mode="json")
    new = merged(TeamCreate, {k: getattr(row, k) for k in TeamCreate.model_fields}, patch)
    for key, value in new.model_dump().items():
        setattr(row, key, value)
    queries.flush(session, f"Team {new.name!r}")
    _audit(session, actor, "update", row, before)
    return public(session, row)


def delete_team(session: Session, team_id: int, actor: str) -> TeamPublic:
    """Delete a team that owns no active key: its revoked keys leave it; its usage records
    keep its id."""
    row = get_team(session, team_id)
    shown = public(session, row)
    if shown.keys:
        raise Conflict(
            f"Team {row.name!r} owns {shown.keys} active keys: move or revoke them first"
        )
    session.execute(update(ApiKey).where(ApiKey.team_id == row.id).values(team_id=None))
    _audit(session, actor, "delete", row, shown.model_dump(mode="json"))
    session.delete(row)
    session.flush()
    return shown


def check_team(session: Session, team_id: int | None) -> None:
    """A key's team must exist (422 otherwise)."""
    if team_id is not None and session.get(Team, team_id) is None:
        raise NotFound(f"Team {team_id} not found", param="team_id")
