"""Quarantines: a method whose greedy answers diverge leaves a model's `auto` choices, audited
with its evidence, until an admin lifts it; only models whose policy asks, only on enough
checks, and only when the rate's interval is wholly above the threshold."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
from fastapi import FastAPI

from gateway.db.session import transaction
from gateway.db.tables import AuditEntry
from gateway.services.quarantine import quarantine_due
from tests.api.test_admin_lossless import check

THRESHOLD, MIN_CHECKS = 0.02, 50


def _checks(model: str, method: str, samples: int, diverged: int, start: int) -> list[Any]:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    return [
        check(
            start + n,
            created_at=now,
            model=model,
            method=method,
            k=None if method == "plain" else 5,
            backend_name=f"{method}-0",
            prefix=4 if n < diverged else None,
        )
        for n in range(samples)
    ]


async def _guard(client: httpx.AsyncClient, model: str, on: bool = True) -> None:
    policy = {"mode": "auto", "lossless_quarantine": on}
    response = await client.put(f"/admin/v1/models/{model}/policy", json=policy)
    assert response.status_code == 200, response.text


def _due(app: FastAPI) -> list[tuple[str, str, dict[str, Any]]]:
    with transaction(app.state.components.sessions) as session:
        made = quarantine_due(session, THRESHOLD, MIN_CHECKS)
        return [(q.model, q.method, dict(q.evidence)) for q in made]


def _seed(app: FastAPI, *groups: list[Any]) -> None:
    with transaction(app.state.components.sessions) as session:
        session.add_all([c for group in groups for c in group])


async def test_a_method_changing_answers_is_quarantined_with_its_evidence(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await _guard(client, "m")
    await _guard(client, "unguarded", on=False)
    _seed(
        app,
        _checks("m", "dspark", 60, 12, 0),  # 20%: interval about 12-32%, wholly over 2%
        _checks("m", "eagle3", 60, 1, 100),  # 1.7%: its interval reaches below 2%
        _checks("m", "dflash", 40, 40, 200),  # all, but fewer than 50 checks
        _checks("m", "plain", 30, 0, 300),  # the floor: never quarantined
        _checks("unguarded", "dspark", 60, 60, 400),  # its policy does not ask
    )
    [(model, method, evidence)] = _due(app)
    assert (model, method) == ("m", "dspark")
    assert (evidence["samples"], evidence["divergences"]) == (60, 12)
    assert evidence["interval_95"][0] > THRESHOLD
    assert evidence["reference_method"] == "plain"
    assert evidence["floor"]["samples"] == 30
    assert evidence["floor"]["divergences"] == 0
    assert evidence["floor"]["interval_95"][0] == 0.0
    assert evidence["threshold"] == THRESHOLD
    assert _due(app) == []  # held already: not again
    listed = (await client.get("/admin/v1/lossless/quarantines")).json()["data"]
    assert [(q["model"], q["method"], q["lifted_at"]) for q in listed] == [("m", "dspark", None)]
    with app.state.components.sessions() as session:
        [entry] = session.query(AuditEntry).filter(AuditEntry.action == "quarantine").all()
        assert (entry.actor, entry.resource_type, entry.resource_id) == (
            "lossless-watchdog",
            "quarantine",
            "m:dspark",
        )
        assert entry.after is not None
        assert entry.after["divergences"] == 12
    app.state.components.registry.load()
    policy = app.state.components.registry.snapshot.policies["m"]
    assert policy.quarantined == frozenset({"dspark"})


async def test_a_lifted_quarantine_is_judged_by_later_checks_only(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await _guard(client, "m")
    _seed(app, _checks("m", "dspark", 60, 30, 0))
    [_] = _due(app)
    [held] = (await client.get("/admin/v1/lossless/quarantines")).json()["data"]
    lifted = await client.delete(f"/admin/v1/lossless/quarantines/{held['id']}")
    assert lifted.status_code == 200, lifted.text
    assert lifted.json()["lifted_by"] == "admin-api"
    assert (await client.delete(f"/admin/v1/lossless/quarantines/{held['id']}")).status_code == 409
    assert (await client.delete("/admin/v1/lossless/quarantines/999")).status_code == 404
    assert _due(app) == []  # the checks before the lift no longer count
    assert (await client.get("/admin/v1/lossless/quarantines")).json()["data"] == []
    everything = await client.get("/admin/v1/lossless/quarantines?include_lifted=true")
    assert [q["id"] for q in everything.json()["data"]] == [held["id"]]
    app.state.components.registry.load()
    assert app.state.components.registry.snapshot.policies["m"].quarantined == frozenset()
    with app.state.components.sessions() as session:
        actions = [e.action for e in session.query(AuditEntry).order_by(AuditEntry.id)]
        assert actions[-2:] == ["quarantine", "lift"]


async def test_a_policy_says_whether_the_watchdog_may_quarantine(
    client: httpx.AsyncClient,
) -> None:
    await _guard(client, "m")
    body = (await client.get("/admin/v1/models/m")).json()
    assert body["policy"]["lossless_quarantine"] is True
    await _guard(client, "m", on=False)
    assert (await client.get("/admin/v1/models/m")).json()["policy"]["lossless_quarantine"] is False


async def test_a_method_no_worse_than_the_engines_own_noise_is_not_quarantined(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    """Plain against plain differs 15 of 60 (an engine nondeterministic across batches):
    DSpark at 20% is surely over the threshold but not over that floor, so it stays; a
    method at 60% is over both."""
    await _guard(client, "m")
    _seed(
        app,
        _checks("m", "plain", 60, 15, 0),
        _checks("m", "dspark", 60, 12, 100),
        _checks("m", "dflash", 60, 36, 200),
    )
    [(_, method, evidence)] = _due(app)
    assert method == "dflash"
    assert evidence["interval_95"][0] > evidence["floor"]["interval_95"][1]
