"""Admin API for teams: groups of keys that spend as one (docs/teams.md)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import ActorDep, SessionDep
from gateway.schemas.resources import ListOf
from gateway.schemas.teams import TeamCreate, TeamPublic, TeamUpdate
from gateway.services import teams

router = APIRouter(prefix="/teams", tags=["keys"])


@router.get("")
def list_teams(session: SessionDep) -> ListOf[TeamPublic]:
    """Every team, by name, with its count of active keys."""
    return ListOf[TeamPublic](data=teams.list_teams(session))


@router.post("", status_code=201)
def post_team(data: TeamCreate, session: SessionDep, actor: ActorDep) -> TeamPublic:
    """Create a team; give keys to it with `team_id` on the key."""
    return teams.create_team(session, data, actor)


@router.get("/{team_id}")
def get_team(team_id: int, session: SessionDep) -> TeamPublic:
    """One team."""
    return teams.public(session, teams.get_team(session, team_id))


@router.patch("/{team_id}")
def patch_team(team_id: int, patch: TeamUpdate, session: SessionDep, actor: ActorDep) -> TeamPublic:
    """Change a team's name or limits."""
    return teams.update_team(session, team_id, patch, actor)


@router.delete("/{team_id}")
def delete_team(team_id: int, session: SessionDep, actor: ActorDep) -> TeamPublic:
    """Delete a team that owns no active key (409 otherwise)."""
    return teams.delete_team(session, team_id, actor)
