"""The ledger's writes: idempotent records and rollups recomputed from them."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select

from gateway.accounting import write_batch
from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.db.tables import UsageHourly, UsageRecord
from gateway.ledger_entry import UsageEntry
from gateway.rollups import recompute_hour

HOUR = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)


def entry(n: int, minute: int = 5, **changes: object) -> UsageEntry:
    values: dict[str, object] = {
        "request_id": f"r{n}",
        "client_request_id": "same-for-all",
        "created_at": HOUR + dt.timedelta(minutes=minute),
        "api_key_id": None,
        "model": "m",
        "method": "p-eagle",
        "backend_name": "b",
        "prompt_tokens": 10,
        "completion_tokens": 100,
        "status_code": 200,
        "outcome": "ok",
        "latency_ms": 50.0,
        "ttft_ms": 5.0,
        "concurrency": 1.0,
        "cost_usd": 0.001,
        "baseline_cost_usd": 0.002,
    }
    values.update(changes)
    return UsageEntry(**values)  # type: ignore[arg-type]


def test_batches_are_idempotent_and_rollups_exact(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        batch = [entry(n) for n in range(10)] + [
            entry(99, status_code=502, outcome="upstream_error")
        ]
        write_batch(sessions, batch)
        write_batch(sessions, batch)  # a retried batch writes nothing twice
        write_batch(sessions, [entry(100, minute=65)])  # the next hour
        with sessions() as session:
            assert session.scalar(select(func.count()).select_from(UsageRecord)) == 12
            rows = session.scalars(select(UsageHourly).order_by(UsageHourly.hour)).all()
        assert [(r.hour, r.requests, r.errors, r.completion_tokens) for r in rows] == [
            (HOUR, 11, 1, 1100),
            (HOUR + dt.timedelta(hours=1), 1, 0, 100),
        ]
        assert rows[0].cost_usd == pytest.approx(0.011)
        assert rows[0].baseline_cost_usd == pytest.approx(0.022)
    finally:
        engine.dispose()


def test_recomputing_an_hour_reproduces_the_incremental_rollups(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        for n in range(5):
            batch = [
                entry(10 * n + i, method=("plain", "dflash")[i % 2],
                      cached_prompt_tokens=(None, 8)[n % 2], prompt_usd_per_mtok=0.5,
                      request_class="interactive",
                      **({} if i % 2 == 0 else  # dflash reported its drafts, plain none
                         {"spec_steps": 20, "draft_tokens": 140, "accepted_tokens": 80 + n}))
                for i in range(7)
            ] + [  # a batch-class request routed by rule 0, and one refused before its class
                entry(100 + n, method="dflash", request_class="batch", rule_index=0,
                      spec_steps=30 + n, draft_tokens=210, accepted_tokens=20),
                entry(200 + n, method=None, backend_name=None, status_code=401),
                # a one-token answer: no verify step, no sample of the class's acceptance
                entry(300 + n, method="dflash", request_class="batch", rule_index=0,
                      completion_tokens=1, spec_steps=0, draft_tokens=0, accepted_tokens=0),
            ]  # fmt: skip
            write_batch(sessions, batch)

        def rollups() -> list[tuple[object, ...]]:
            with sessions() as session:
                rows = session.scalars(
                    select(UsageHourly).order_by(UsageHourly.method, UsageHourly.request_class)
                ).all()
                return [
                    (r.method, r.request_class, r.rule_index, r.requests, r.completion_tokens,
                     round(r.cost_usd, 9), r.cached_prompt_tokens,
                     round(r.prefill_saved_by_cache_usd, 12),
                     (r.spec_steps, r.draft_tokens, r.accepted_tokens),
                     (r.spec_requests, r.accepted_sq, r.accepted_steps, r.steps_sq))
                    for r in rows
                ]  # fmt: skip

        incremental = rollups()
        with transaction(sessions) as session:
            recompute_hour(session, HOUR)
        # Batches 1 and 3 said 8 cached tokens a record: 6 dflash and 8 plain records.
        interactive = [80 + n for n in range(5) for _ in range(3)]
        batch_steps = [30 + n for n in range(5)]
        assert (
            rollups()
            == incremental
            == [
                ("", "", -1, 5, 500, 0.005, 0, 0.0, (0, 0, 0), (0, 0.0, 0.0, 0.0)),
                ("dflash", "batch", 0, 10, 505, 0.01, 0, 0.0, (160, 1050, 100),
                 (5, 5 * 400.0, 20.0 * sum(batch_steps), float(sum(s * s for s in batch_steps)))),
                ("dflash", "interactive", -1, 15, 1500, 0.015, 48, 48 * 0.5e-6,
                 (300, 2100, sum(interactive)),
                 (15, float(sum(a * a for a in interactive)), 20.0 * sum(interactive),
                  15 * 400.0)),
                ("plain", "interactive", -1, 20, 2000, 0.02, 64, 64 * 0.5e-6, (0, 0, 0),
                 (0, 0.0, 0.0, 0.0)),
            ]
        )  # fmt: skip
    finally:
        engine.dispose()


def test_key_spend_in_the_snapshot_comes_from_the_rollups(database_url: str) -> None:
    from gateway.db.tables import ApiKey
    from gateway.registry import load_snapshot

    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        with transaction(sessions) as session:
            key = ApiKey(
                name="k",
                key_prefix="dg-x",
                key_hash="h" * 64,
                budget_usd=1.0,
                budget_period="total",
            )
            session.add(key)
        write_batch(sessions, [entry(n, api_key_id=key.id, cost_usd=0.25) for n in range(3)])
        with sessions() as session:
            assert load_snapshot(session).key_spend_usd == {key.id: pytest.approx(0.75)}
    finally:
        engine.dispose()
