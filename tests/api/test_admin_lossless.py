"""GET /admin/v1/lossless: divergences from the reference replays per group, the floor beside
them, and what the replays cost."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gateway.accounting import write_batch
from gateway.db.session import transaction
from gateway.db.tables import LosslessCheck
from gateway.ledger_entry import UsageEntry
from tests.api.test_admin_backends import assert_envelope
from tests.api.test_ledger import HOUR, entry
from tests.conftest import READ_TOKEN

PERIOD = {"from": HOUR.isoformat(), "to": (HOUR + dt.timedelta(hours=1)).isoformat()}
EAGLE3 = {"method": "eagle3", "k": 3, "drafter": "org/eagle3-drafter", "backend_name": "e-0"}


def check(n: int, minute: int = 5, prefix: int | None = None, **changes: object) -> LosslessCheck:
    """A check of answer `n`: it diverged at `prefix` when one is given, else matched."""
    values: dict[str, object] = {
        "created_at": HOUR + dt.timedelta(minutes=minute),
        "model": "m",
        "method": "plain",
        "k": None,
        "drafter": None,
        "backend_name": "plain-0",
        "engine_version": "0.11.0",
        "reference_method": "plain",
        "reference_backend": "plain-1",
        "reference_engine_version": "0.11.0",
        "unit": "token",
        "served_length": 50,
        "reference_length": 50,
        "common_prefix": 50 if prefix is None else prefix,
        "diverged": prefix is not None,
        "served_sha256": "a" * 64,
        "reference_sha256": ("a" if prefix is None else "b") * 64,
        "served_request_id": f"served-{n}",
        "replay_request_id": f"replay-{n}",
    }
    return LosslessCheck(**(values | changes))


def _checks() -> list[LosslessCheck]:
    floor = [  # plain against plain on two backends: 3 of 60 and 2 of 40 differ
        check(n, minute=1 + n % 50, prefix=7 if n < 3 else None) for n in range(60)
    ] + [check(100 + n, prefix=9 if n < 2 else None, backend_name="plain-2") for n in range(40)]
    eagle3 = [  # 4 of 10 differ, at tokens 40, 10, 30, 20
        check(200 + n, minute=10 + n, prefix=(40, 10, 30, 20)[n] if n < 4 else None, **EAGLE3)
        for n in range(10)
    ]
    ngram = [  # compared by text once: the first divergence's unit is mixed
        check(300, prefix=3, method="ngram", k=4),
        check(301, prefix=12, method="ngram", k=4, unit="char"),
        check(302, method="ngram", k=4),
    ]
    elsewhere = [
        check(400, model="other"),  # another model
        check(401, minute=61, prefix=1, **EAGLE3),  # after the period
        check(402, minute=-1, prefix=1, **EAGLE3),  # before it
    ]
    return floor + eagle3 + ngram + elsewhere


def _replays() -> list[UsageEntry]:
    replay = {"request_class": "lossless-replay", "method": "plain", "backend_name": "plain-1"}
    return [
        entry(0, minute=2, cost_usd=0.001, **replay),
        entry(1, minute=3, cost_usd=0.002, **replay),
        entry(2, minute=4, cost_usd=None, **replay),  # unpriced: counted, not in the cost
        entry(3, minute=70, cost_usd=0.5, **replay),  # after the period
        entry(4, minute=5, cost_usd=0.25),  # served traffic, not a replay
        entry(5, minute=6, cost_usd=0.004, model="replayed-only", **replay),
    ]


def _seed(app: FastAPI) -> None:
    with transaction(app.state.components.sessions) as session:
        session.add_all(_checks())
    write_batch(app.state.components.sessions, _replays())


async def _model(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    response = await client.get("/admin/v1/lossless", params=PERIOD)
    assert response.status_code == 200, response.text
    model: dict[str, Any] = next(m for m in response.json()["models"] if m["model"] == name)
    return model


async def test_each_group_has_its_rate_interval_and_first_divergence(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    _seed(app)
    body = (await client.get("/admin/v1/lossless", params=PERIOD)).json()
    assert (body["from"], body["to"]) == (PERIOD["from"], PERIOD["to"])
    assert [m["model"] for m in body["models"]] == ["m", "other", "replayed-only"]
    groups = body["models"][0]["groups"]
    assert [(g["method"], g["backend"], g["is_floor"]) for g in groups] == [
        ("plain", "plain-0", True),  # the floor first
        ("plain", "plain-2", True),
        ("eagle3", "e-0", False),
        ("ngram", "plain-0", False),
    ]
    eagle3 = groups[2]
    assert (eagle3["samples"], eagle3["divergences"], eagle3["divergence_rate"]) == (10, 4, 0.4)
    assert (eagle3["k"], eagle3["drafter"], eagle3["engine_version"]) == (
        3,
        "org/eagle3-drafter",
        "0.11.0",
    )
    assert eagle3["reference_method"] == "plain"
    assert eagle3["interval_95"] == pytest.approx([0.1682, 0.6873], abs=5e-5)
    assert eagle3["first_divergence"] == {
        "unit": "token",
        "min": 10,
        "p25": 17.5,
        "p50": 25.0,
        "p75": 32.5,
        "max": 40,
    }
    first_seen, last_seen = (
        dt.datetime.fromisoformat(eagle3[k]) for k in ("first_seen", "last_seen")
    )
    assert (first_seen, last_seen) == (
        HOUR + dt.timedelta(minutes=10),
        HOUR + dt.timedelta(minutes=19),
    )
    assert groups[3]["first_divergence"]["unit"] == "mixed"
    assert (eagle3["by_tokens"], groups[3]["by_tokens"]) == (10, groups[3]["samples"] - 1)
    assert groups[3]["first_divergence"]["min"] == 3


async def test_the_floor_pools_every_method_against_itself(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    _seed(app)
    floor = (await _model(client, "m"))["floor"]
    assert (floor["samples"], floor["divergences"], floor["divergence_rate"]) == (100, 5, 0.05)
    assert floor["interval_95"] == pytest.approx([0.0215, 0.1118], abs=5e-5)
    other = await _model(client, "other")
    assert other["floor"]["interval_95"] == pytest.approx([0.0, 0.7935], abs=5e-5)  # 0 of 1
    assert other["groups"][0]["first_divergence"] is None
    unchecked = await _model(client, "replayed-only")
    assert unchecked["groups"] == []
    assert unchecked["floor"] == {
        "samples": 0,
        "divergences": 0,
        "divergence_rate": None,
        "interval_95": None,
    }


async def test_the_replays_cost_is_their_own_line(client: httpx.AsyncClient, app: FastAPI) -> None:
    _seed(app)
    replays = (await _model(client, "m"))["replays"]
    assert (replays["requests"], replays["unpriced"]) == (3, 1)
    assert replays["cost_usd"] == pytest.approx(0.003)  # not the served request's 0.25
    assert (await _model(client, "other"))["replays"] == {
        "requests": 0,
        "unpriced": 0,
        "cost_usd": 0.0,
    }
    assert (await _model(client, "replayed-only"))["replays"]["cost_usd"] == pytest.approx(0.004)


async def test_the_model_and_the_period_filter(client: httpx.AsyncClient, app: FastAPI) -> None:
    _seed(app)
    only = (await client.get("/admin/v1/lossless", params=PERIOD | {"model": "other"})).json()
    assert [m["model"] for m in only["models"]] == ["other"]
    day = {"from": "2026-11-29", "to": "2026-11-30"}  # the checks either side of the hour too
    body = (await client.get("/admin/v1/lossless", params=day | {"model": "m"})).json()
    (model,) = body["models"]
    eagle3 = next(g for g in model["groups"] if g["method"] == "eagle3")
    assert (eagle3["samples"], eagle3["divergences"]) == (12, 6)
    assert model["replays"]["requests"] == 4
    late = {"from": (HOUR + dt.timedelta(hours=1)).isoformat(), "to": "2026-11-30"}
    body = (await client.get("/admin/v1/lossless", params=late | {"model": "m"})).json()
    assert [g["method"] for g in body["models"][0]["groups"]] == ["eagle3"]
    assert body["models"][0]["replays"]["cost_usd"] == pytest.approx(0.5)
    empty = {"from": "2026-01-01", "to": "2026-01-02"}
    assert (await client.get("/admin/v1/lossless", params=empty)).json()["models"] == []


async def test_the_period_defaults_to_the_last_30_days(client: httpx.AsyncClient) -> None:
    body = (await client.get("/admin/v1/lossless")).json()
    start, end = (dt.datetime.fromisoformat(body[k]) for k in ("from", "to"))
    assert end - start == dt.timedelta(days=30)
    assert abs(dt.datetime.now(dt.UTC) - end) < dt.timedelta(minutes=1)


async def test_it_needs_an_admin_token_and_a_read_token_will_do(client: httpx.AsyncClient) -> None:
    client.headers.pop("Authorization")
    assert_envelope(await client.get("/admin/v1/lossless"), 401)
    wrong = {"Authorization": "Bearer wrong-token"}
    assert_envelope(await client.get("/admin/v1/lossless", headers=wrong), 401)
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    assert (await client.get("/admin/v1/lossless", headers=read)).status_code == 200


async def test_a_bad_time_is_422(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.get("/admin/v1/lossless", params={"from": "yesterday"}), 422)
