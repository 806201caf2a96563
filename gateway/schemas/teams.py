"""Teams as the admin API takes and shows them (docs/teams.md)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from gateway.schemas.resources import KeyName, Name, Public, Strict


class TeamLimits(Strict):
    """What a team's keys may spend and send together; None means unlimited."""

    budget_usd: float | None = Field(
        default=None, ge=0, description="Its keys' spend together, per budget_period."
    )
    budget_period: Literal["daily", "monthly", "total"] = "monthly"
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    allowed_models: list[Name] | None = Field(
        default=None,
        description="The models its keys may use; a key's own list narrows it further.",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Its share of a full model's backends beside other teams' (fair share).",
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description=(
            "Its requests' priority, lower first (vLLM's order): in the fair-share queue, and "
            "sent to backends that schedule by priority. A request class's priority wins."
        ),
    )


class TeamCreate(TeamLimits):
    """A new team."""

    name: KeyName


class TeamUpdate(Strict):
    """A partial change to a team's name or limits."""

    name: KeyName | None = None
    budget_usd: float | None = Field(default=None, ge=0)
    budget_period: Literal["daily", "monthly", "total"] | None = None
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    allowed_models: list[Name] | None = None
    weight: float | None = Field(default=None, gt=0, le=1000)
    priority: int | None = Field(default=None, ge=-100, le=100)


class TeamPublic(Public):
    """A team, with how many active keys it owns."""

    id: int
    name: str
    budget_usd: float | None
    budget_period: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    allowed_models: list[str] | None
    weight: float
    priority: int
    created_at: dt.datetime
    keys: int = Field(default=0, description="Its keys not revoked")
