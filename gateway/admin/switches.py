"""Admin API for switching a managed backend to another method or K without dropping requests."""

from __future__ import annotations

import re
from typing import Any

import anyio.to_thread
from fastapi import APIRouter
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import Backend
from gateway.deps import Components, ComponentsDep, SessionDep
from gateway.errors import Conflict
from gateway.schemas.resources import BackendCreate, BackendSwitch, SwitchAccepted
from gateway.services.changes import merged

router = APIRouter(prefix="/backends", tags=["backends"])


def switch_target(row: Backend, data: BackendSwitch) -> BackendCreate:
    """The backend that will replace `row`: same model and GPUs, the requested decoding."""
    current: dict[str, Any] = {
        "name": data.name or derived_name(row.name, row.method, data.method, data.k),
        "url": row.url,  # replaced by the new server's address once it has a port
        "model": row.model,
        "gpu_type": row.gpu_type,
        "gpu_count": row.gpu_count,
        "enabled": True,
        "managed": True,
    }
    if data.method == row.method:  # a new K for the same drafter
        current |= {"drafter": row.drafter, "speculative_options": row.speculative_options}
    return merged(BackendCreate, current, data.model_copy(update={"name": current["name"]}))


def derived_name(old: str, old_method: str, method: str, k: int | None) -> str:
    """`demo-eagle3` → `demo-dflash`; a name without the method gets it appended."""
    base = re.sub(rf"-{re.escape(old_method)}(-k\d+)?$", "", old)
    return f"{base}-{method}" + (f"-k{k}" if k is not None else "")


def checked_target(
    session: Session, components: Components, name: str, data: BackendSwitch
) -> BackendCreate:
    """The backend that will replace `name`, once it is known to exist and be switchable
    and the new name to be free (database reads: run in a worker thread)."""
    row = queries.get_backend(session, name)
    components.managed.check_switchable(name)
    target = switch_target(row, data)
    if queries.find_backend(session, target.name) is not None:
        raise Conflict(f"backend {target.name!r} already exists", param="name")
    return target


@router.post("/{name}/switch", status_code=202)
async def post_switch(
    name: str, data: BackendSwitch, session: SessionDep, components: ComponentsDep
) -> SwitchAccepted:
    """Start a new server with the requested method and K, shift traffic, retire the old one.

    Returns once the switch is under way; the audit log of the old backend records the
    traffic shift (`switch`), the old server's removal (`delete`) or a failed start
    (`switch-failed`, with the new server's last log lines).
    """
    target = await anyio.to_thread.run_sync(checked_target, session, components, name, data)
    # on the event loop, which runs the switch: Conflict when `name` is not switchable now
    await components.managed.begin_switch(
        name, target, components.registry, components.sessions, components.settings
    )
    return SwitchAccepted(old_name=name, new_name=target.name, method=target.method, k=target.k)
