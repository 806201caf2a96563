"""Backends: audited changes, and a backend as the API shows it.

Live acceptance (this replica's last scrape) and stored acceptance (the newest measurement)
are merged by one rule, `with_runtime`: the scrape when there is one, else the measurement.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from sqlalchemy import update
from sqlalchemy.orm import Session

from backends.methods import render_speculative_config, spec_from_options
from gateway.db import queries
from gateway.db.tables import Backend, Measurement
from gateway.errors import ValidationFailed
from gateway.registry import Registry, Snapshot
from gateway.schemas.resources import (
    BackendCreate,
    BackendFields,
    BackendPublic,
    BackendRuntime,
    BackendUpdate,
)
from gateway.services.changes import merged
from gateway.services.models import ensure_model
from gateway.urls import is_link_local


def backend_public(row: Backend) -> BackendPublic:
    """A backend as the API shows it, with its rendered vLLM speculative config."""
    public = BackendPublic.model_validate(row)
    spec = spec_from_options(row.method, row.k, row.drafter, row.speculative_options)
    public.speculative_config = render_speculative_config(spec)
    public.has_api_key = row.api_key is not None
    return public


def _fields(row: Backend) -> dict[str, Any]:
    keys = BackendFields.model_fields.keys()
    return {key: getattr(row, key) for key in keys}


def _snapshot(row: Backend) -> dict[str, Any]:
    return backend_public(row).model_dump(mode="json")


def _audit(
    session: Session,
    actor: str,
    action: str,
    name: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    queries.record_audit(
        session, actor=actor, action=action, resource=("backend", name), before=before, after=after
    )


def _assign(row: Backend, fields: BackendFields, allow_link_local: bool) -> None:
    host = fields.url.host or ""
    if is_link_local(host) and not allow_link_local:
        message = (
            f"url {host!r} is a link-local or cloud metadata address; set "
            "DRAFTGATE_ALLOW_LINK_LOCAL_BACKENDS=true if a backend really listens there"
        )
        raise ValidationFailed(message, param="url")
    for key in BackendFields.model_fields:
        setattr(row, key, getattr(fields, key))
    row.url = fields.normalised_url()


def create_backend(
    session: Session,
    data: BackendCreate,
    actor: str,
    *,
    allow_link_local: bool = False,
    pool: str | None = None,
) -> Backend:
    """Add a backend (and its model, if new); `pool` names the pool it is a member of."""
    row = Backend(name=data.name, pool=pool)
    _assign(row, data, allow_link_local)
    queries.add(session, row, f"backend {data.name!r}")
    ensure_model(session, data.model, actor)
    _audit(session, actor, "create", row.name, None, _snapshot(row))
    return row


def update_backend(
    session: Session, name: str, patch: BackendUpdate, actor: str, *, allow_link_local: bool = False
) -> Backend:
    """Change some fields of a backend, validating the result as a whole."""
    row = queries.get_backend(session, name)
    before = _snapshot(row)
    _assign(row, merged(BackendFields, _fields(row), patch), allow_link_local)
    queries.flush(session, f"backend {name!r}")
    ensure_model(session, row.model, actor)
    _audit(session, actor, "update", name, before, _snapshot(row))
    return row


def delete_backend(session: Session, name: str, actor: str) -> None:
    """Remove a backend."""
    row = queries.get_backend(session, name)
    before = _snapshot(row)
    session.delete(row)
    session.flush()
    _audit(session, actor, "delete", name, before, None)


def with_runtime(
    row: Backend, registry: Registry, measured: dict[str, Measurement]
) -> BackendPublic:
    """The backend with what this replica sees of it now (health, load, acceptance, mismatch)."""
    public = backend_public(row)
    state = registry.states.get(row.name)
    if state is not None and row.enabled:
        public.runtime = BackendRuntime(
            healthy=state.healthy,
            circuit_open=state.open_until > time.monotonic(),
            in_flight=state.in_flight,
            waiting=state.waiting,
            kv_cache_usage=state.kv_usage,
            max_model_len=state.max_model_len,
            engine_version=state.engine_version or None,
            method_mismatch=state.mismatch,
            pricing=pricing(registry.snapshot, row),
        )
        stored = measured.get(row.name)
        if state.acceptance_length is not None and row.method != "plain":
            public.runtime.acceptance_length = state.acceptance_length
            public.runtime.acceptance_per_position = list(state.acceptance_per_position or ())
            public.runtime.acceptance_source = "scrape"
        elif stored is not None:
            public.runtime.acceptance_length = stored.mean_acceptance_length
            public.runtime.acceptance_per_position = stored.acceptance_per_position
            public.runtime.acceptance_source = "measurement"
    return public


def pricing(snapshot: Snapshot, row: Backend) -> Literal["curve", "gpu_time", "unpriced"]:
    """How the relay prices this backend's requests (`BackendRuntime.pricing`)."""
    if (row.model, row.method, row.gpu_type) in snapshot.curves:
        return "curve"
    return "gpu_time" if row.gpu_type in snapshot.prices else "unpriced"


def record_engine_versions(
    session: Session, versions: Mapping[str, str | None], actor: str
) -> list[str]:
    """Store each backend's engine version as read (an observation: `updated_at` stays the
    configuration's); a change from one known version to another (an upgrade, a downgrade)
    is audited. The backends whose version changed."""
    changed = []
    for name, version in versions.items():
        row = queries.find_backend(session, name)
        if row is None or row.engine_version == version:
            continue
        before = row.engine_version
        session.execute(
            update(Backend)
            .where(Backend.id == row.id)
            .values(engine_version=version, updated_at=Backend.updated_at)
        )
        if before is not None and version is not None:
            _audit(session, actor, "update", name, {"engine_version": before},
                   {"engine_version": version})  # fmt: skip
        changed.append(name)
    return changed


def shift_backend(session: Session, old_name: str, target: BackendCreate, actor: str) -> str:
    """Register `target` and disable `old_name` in one change, audited as a `switch` of the
    old backend; the old backend's URL."""
    old = queries.get_backend(session, old_name)
    before = _snapshot(old)
    old.enabled = False
    new = create_backend(session, target, actor)
    _audit(session, actor, "switch", old_name, before, _snapshot(new))
    return old.url


def record_switch_failure(
    session: Session, old_name: str, target: BackendCreate, reason: str, actor: str
) -> None:
    """Audit a switch whose new server never served (`switch-failed`), with the reason."""
    shown = target.model_dump(mode="json", exclude={"api_key"})  # write-only, never audited
    after: dict[str, Any] = {"target": shown, "error": reason}
    _audit(session, actor, "switch-failed", old_name, None, after)


def release_stopped(session: Session, names: Iterable[str], actor: str) -> None:
    """Disable the backends whose servers this process stopped (`stop`): their GPUs are no
    longer held, so spend stops accruing; a later start enables them again."""
    for name in names:
        row = queries.find_backend(session, name)
        if row is None or not row.enabled:
            continue
        before = _snapshot(row)
        row.enabled = False
        queries.flush(session, f"backend {name!r}")
        _audit(session, actor, "stop", name, before, _snapshot(row))
