"""Database outage under streaming load: the gateway keeps proxying and loses no record.

PostgreSQL is shared with everything else on the machine, so it is never stopped: the
gateway reaches it through a TCP relay the test controls, and cutting the relay (existing
connections reset, new ones refused) is the outage. Meanwhile streamed requests must all
complete, usage records wait in memory (the `draftgate_ledger_pending` gauge shows how many,
bounded by `ledger_max_pending`), admin calls and /ready answer 503 with the error envelope;
after it every record is written exactly once.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.conftest import POSTGRES_URL
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    Server,
    ServerStarter,
    draftgate_env,
    fleet_backend,
    gateway_env,
    metric_value,
    query_rows,
    sim_args,
    start_server,
)
from tests.reliability.streaming_load import Outcome, StreamingLoad, failures, stream_once
from tests.reliability.tcp_relay import TcpRelay

__all__ = ["start_server"]  # the fixture, imported for this module's tests

pytestmark = pytest.mark.postgres

OUTAGE_S = 15.0
CLIENTS = 16
RECOVERY_TIMEOUT_S = 60.0
LEDGER_TIMEOUT_S = 90.0
ADMIN_PATHS = ("/admin/v1/backends", "/admin/v1/keys", "/admin/v1/savings")
POLL_S = 0.5
PRICE = {
    "gpu_type": "B200",
    "kind": "on-demand",
    "usd_per_gpu_hour": 5.0,
    "source": "test",
    "date": "2026-01-01",
}
BUDGET_REQUESTS = 10
# Long enough for the ledger's retries to back off to their longest interval (5 s), so the
# registry reloads from the returned database before the held records are written.
BUDGET_OUTAGE_S = 14.0
AFTER_OUTAGE_S = 10.0
BOUNDED_OUTAGE_MAX_S = 60.0


@dataclass
class Stack:
    """A gateway on PostgreSQL through a relay, and two sims behind it."""

    gateway: Server
    relay: TcpRelay
    database_url: str  # direct, for the test's own reads


@dataclass
class OutageLog:
    """What the test saw while the database was away."""

    ready: Counter[int] = field(default_factory=Counter)
    admin: Counter[int] = field(default_factory=Counter)
    admin_bad_bodies: list[str] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)  # the gauge, once per poll

    @property
    def pending_max(self) -> float:
        """The most records held at once, as the gauge showed."""
        return max(self.pending, default=0.0)


# Tests take postgres_schema first: fixtures are torn down in reverse, so the gateway stops
# before its schema is dropped.


@pytest.fixture
def relay() -> Iterator[TcpRelay]:
    """A relay to the shared PostgreSQL server."""
    server = urlsplit(POSTGRES_URL)
    relay = TcpRelay(server.hostname or "127.0.0.1", server.port or 5432).start()
    try:
        yield relay
    finally:
        relay.close()


def start_stack(
    start_server: ServerStarter, relay: TcpRelay, postgres_schema: str, **settings: str
) -> Stack:
    """Two fast sims and a gateway whose database connections go through `relay`."""
    sims = [
        start_server(*sim_args("--time-scale", "5", "--seed", str(i)), env=draftgate_env())
        for i in range(2)
    ]
    fleet = sims[0].log_path.parent / f"fleet-{relay.port}.yaml"
    backends = [fleet_backend(f"sim-{i}", sim.base_url) for i, sim in enumerate(sims)]
    document = {"backends": backends, "prices": [PRICE]}
    fleet.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    env = gateway_env(relay.url_for(postgres_schema), fleet, **settings)
    gateway = start_server("gateway", env=env)
    return Stack(gateway, relay, postgres_schema)


def watch_outage(
    stack: Stack, seconds: float, until: Callable[[], bool] = lambda: False
) -> OutageLog:
    """Poll /ready, admin reads and writes and the pending gauge for `seconds`, or less once
    `until()` holds."""
    log, deadline = OutageLog(), time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=stack.gateway.base_url, headers=headers, timeout=30.0) as http:
        while time.monotonic() < deadline:
            log.ready[http.get("/ready").status_code] += 1
            for path in ADMIN_PATHS:
                _admin_call(http.get(path), log)
            _admin_call(
                http.put(f"/admin/v1/models/{SIM_MODEL}/policy", json={"mode": "auto"}), log
            )
            log.pending.append(metric_value(stack.gateway.base_url, "draftgate_ledger_pending"))
            if until():
                break
            time.sleep(POLL_S)
    return log


def _admin_call(response: httpx.Response, log: OutageLog) -> None:
    log.admin[response.status_code] += 1
    error = response.json().get("error") if response.status_code == 503 else None
    if not (isinstance(error, dict) and error.get("type") and error.get("message")):
        log.admin_bad_bodies.append(f"{response.status_code} {response.text[:200]}")


def dropped_so_far(stack: Stack) -> float:
    """Records the gateway dropped because its ledger was full."""
    return metric_value(stack.gateway.base_url, "draftgate_ledger_dropped_total")


def wait_ready(base_url: str, timeout_s: float) -> float:
    """Seconds until GET /ready answers 200."""
    started = time.monotonic()
    while httpx.get(f"{base_url}/ready", timeout=30.0).status_code != 200:
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"/ready not 200 within {timeout_s} s of the database's return")
        time.sleep(POLL_S)
    return time.monotonic() - started


def wait_for_rows(database_url: str, expected: int, timeout_s: float) -> list[dict[str, object]]:
    """Poll usage_records until `expected` rows are there (or the timeout); the rows."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = query_rows(
            database_url,
            "SELECT request_id, client_request_id, "
            "completion_tokens, status_code FROM usage_records",
        )
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(POLL_S)


def test_outage_under_streaming_load_loses_no_record(
    postgres_schema: str, relay: TcpRelay, start_server: ServerStarter
) -> None:
    """15 s without the database: no client failure, 503s meanwhile, every record once."""
    stack = start_stack(start_server, relay, postgres_schema)
    load = StreamingLoad([stack.gateway.base_url], SIM_MODEL, CLIENTS).start()
    time.sleep(3.0)
    assert httpx.get(f"{stack.gateway.base_url}/ready", timeout=30.0).status_code == 200
    before = load.count()
    relay.cut()
    log = watch_outage(stack, OUTAGE_S)
    during = load.count() - before
    relay.restore()
    recovery_s = wait_ready(stack.gateway.base_url, RECOVERY_TIMEOUT_S)
    time.sleep(3.0)
    outcomes = load.stop()

    rows = wait_for_rows(stack.database_url, len(outcomes), LEDGER_TIMEOUT_S)
    sent_ids = {o.request_id for o in outcomes}
    row_ids = [r["client_request_id"] for r in rows]
    client_tokens = sum(o.completion_tokens for o in outcomes)
    row_tokens = sum(int(str(r["completion_tokens"])) for r in rows)
    dropped = metric_value(stack.gateway.base_url, "draftgate_ledger_dropped_total")
    retried = metric_value(stack.gateway.base_url, "draftgate_upstream_retries_total")
    print(
        f"\ndb outage {OUTAGE_S:.0f} s, c={CLIENTS}: requests sent {len(outcomes)} "
        f"({during} during the outage), failed {len(failures(outcomes))}, retried {retried:.0f}, "
        f"records written {len(rows)}, lost {len(sent_ids - set(row_ids))}, "
        f"duplicated {len(row_ids) - len(set(row_ids))}, held max {log.pending_max:.0f}, "
        f"dropped {dropped:.0f}, /ready during {dict(log.ready)}, admin during {dict(log.admin)}, "
        f"ready again {recovery_s:.1f} s after the database returned, "
        f"completion tokens client {client_tokens} / ledger {row_tokens}, "
        f"connections refused by the relay {relay.refused}"
    )
    assert failures(outcomes) == [], failures(outcomes)[:5]
    assert during > 0, "no request was served during the outage"
    assert log.pending_max > 0, "no record was held during the outage"
    # Requests finish all the time, so the gauge rises at every poll: it is read live,
    # not updated only when the writer retries.
    assert all(b > a for a, b in itertools.pairwise(log.pending)), log.pending
    assert dropped == 0
    assert set(log.admin) == {503}, log.admin_bad_bodies[:5]
    assert log.admin_bad_bodies == []
    assert log.ready[503] > 0
    assert set(log.ready) == {503}
    assert len(set(row_ids)) == len(row_ids), "a client request was recorded twice"
    assert len({r["request_id"] for r in rows}) == len(rows)
    assert set(row_ids) == sent_ids, f"{len(sent_ids - set(row_ids))} records lost"
    assert row_tokens == client_tokens
    assert metric_value(stack.gateway.base_url, "draftgate_ledger_pending") == 0


def test_held_records_are_bounded_and_the_excess_counted(
    postgres_schema: str, relay: TcpRelay, start_server: ServerStarter
) -> None:
    """With room for 20 pending records, an outage holds at most 20 and counts the rest."""
    max_pending = 20
    stack = start_stack(start_server, relay, postgres_schema, LEDGER_MAX_PENDING=str(max_pending))
    load = StreamingLoad([stack.gateway.base_url], SIM_MODEL, 4).start()
    time.sleep(2.0)
    relay.cut()
    # Until records beyond the room were dropped: how long that takes depends on how fast
    # a busy machine serves the load.
    log = watch_outage(stack, BOUNDED_OUTAGE_MAX_S, lambda: dropped_so_far(stack) > 0)
    relay.restore()
    wait_ready(stack.gateway.base_url, RECOVERY_TIMEOUT_S)
    outcomes = load.stop()
    dropped = metric_value(stack.gateway.base_url, "draftgate_ledger_dropped_total")
    rows = wait_for_rows(stack.database_url, len(outcomes) - int(dropped), LEDGER_TIMEOUT_S)
    print(
        f"\nbounded ledger (max {max_pending}): requests sent {len(outcomes)}, "
        f"failed {len(failures(outcomes))}, held max {log.pending_max:.0f}, "
        f"dropped {dropped:.0f}, written {len(rows)}"
    )
    assert failures(outcomes) == []
    assert 0 < log.pending_max <= max_pending
    assert dropped > 0
    assert {r["client_request_id"] for r in rows} <= {o.request_id for o in outcomes}
    # Every record is written or counted as dropped. A batch whose commit reached the
    # database as the connection was cut looked failed and stayed queued, so records of it
    # may be written and counted as dropped too: at most one queue's worth.
    assert len(rows) + dropped >= len(outcomes)
    assert len(rows) + dropped <= len(outcomes) + max_pending


def send_until(
    http: httpx.Client, url: str, key: str, stop: Callable[[Outcome], bool], seconds: float
) -> list[Outcome]:
    """Send streamed requests one after another until `stop(outcome)` or `seconds` pass."""
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        outcomes.append(stream_once(http, url, SIM_MODEL, 16, key))
        if stop(outcomes[-1]):
            break
    return outcomes


def test_budget_holds_through_an_outage_and_the_recovery(
    postgres_schema: str, relay: TcpRelay, start_server: ServerStarter
) -> None:
    """A key that spends its budget while the database is away stays refused afterwards.

    During the outage only this replica's own count of the spend enforces the budget; after
    it, the registry reloads spend from the rollups, which do not hold the records the
    ledger is still holding: those must still count.
    """
    stack = start_stack(
        start_server, relay, postgres_schema, REQUIRE_API_KEY="true", REGISTRY_REFRESH_S="1"
    )
    url = stack.gateway.base_url
    with stack.gateway.client(ADMIN_TOKEN) as admin, httpx.Client(timeout=60.0) as http:
        probe_key = admin.post("/admin/v1/keys", json={"name": "probe"}).json()["key"]
        probe = stream_once(http, url, SIM_MODEL, 16, probe_key)
        assert probe.completed, probe
        wait_for_rows(stack.database_url, 1, LEDGER_TIMEOUT_S)
        costs = query_rows(stack.database_url, "SELECT cost_usd FROM usage_records")
        per_request_usd = float(costs[0]["cost_usd"])
        assert per_request_usd > 0
        budget = {
            "name": "budget",
            "budget_usd": BUDGET_REQUESTS * per_request_usd,
            "budget_period": "total",
        }
        created = admin.post("/admin/v1/keys", json=budget).json()
        key = created["key"]
        relay.cut()
        cut_at = time.monotonic()
        during = send_until(http, url, key, lambda o: o.status == 429, BUDGET_OUTAGE_S)
        time.sleep(max(0.0, BUDGET_OUTAGE_S - (time.monotonic() - cut_at)))
        relay.restore()
        after = send_until(http, url, key, lambda o: False, AFTER_OUTAGE_S)
    admitted_after = [o for o in after if o.status == 200]
    served = sum(o.status == 200 for o in during) + len(admitted_after)
    sql = (
        "SELECT count(*) AS n, coalesce(sum(cost_usd), 0) AS usd FROM usage_records "
        "WHERE api_key_id = :key AND status_code = 200"
    )
    deadline = time.monotonic() + LEDGER_TIMEOUT_S
    while (spent := query_rows(stack.database_url, sql, key=created["id"])[0])["n"] < served:
        assert time.monotonic() < deadline, f"{spent['n']} of {served} served records written"
        time.sleep(POLL_S)
    print(
        f"\nbudget of {BUDGET_REQUESTS} requests through a {BUDGET_OUTAGE_S:.0f} s outage: "
        f"served {sum(o.status == 200 for o in during)} during it before the first refusal, "
        f"then {len(admitted_after)} of {len(after)} admitted in the {AFTER_OUTAGE_S:.0f} s "
        f"after the database returned; spent ${float(spent['usd']):.6f} of "
        f"${budget['budget_usd']:.6f}"
    )
    assert during[-1].status == 429, "the budget never refused during the outage"
    # What the budget promises: the key's spend never passes it. A request may still be
    # admitted after the outage where its worst case fits what is left (the worst case is
    # priced at the curves, which the database's return refreshes); had the records held
    # through the outage been forgotten, the key would have been served its budget again.
    assert float(spent["usd"]) <= budget["budget_usd"] * (1 + 1e-9), spent
    assert len(admitted_after) < BUDGET_REQUESTS - sum(o.status == 200 for o in during), after


def test_silent_database_gets_503s_not_hangs(
    postgres_schema: str, relay: TcpRelay, start_server: ServerStarter
) -> None:
    """A database host that accepts connections and never answers: proxying goes on, and
    admin calls and /ready answer 503 (within the connect timeout) instead of hanging."""
    stack = start_stack(start_server, relay, postgres_schema)
    load = StreamingLoad([stack.gateway.base_url], SIM_MODEL, 4).start()
    time.sleep(2.0)
    relay.cut(silent=True)
    started = time.monotonic()
    paths = ["/ready", *ADMIN_PATHS * 4]  # more callers than the connection pool holds
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with (
        httpx.Client(base_url=stack.gateway.base_url, headers=headers, timeout=90.0) as http,
        ThreadPoolExecutor(len(paths)) as pool,
    ):
        responses = list(pool.map(http.get, paths))
    answered_s = time.monotonic() - started
    relay.restore()
    wait_ready(stack.gateway.base_url, RECOVERY_TIMEOUT_S)
    outcomes = load.stop()
    rows = wait_for_rows(stack.database_url, len(outcomes), LEDGER_TIMEOUT_S)
    statuses = Counter(r.status_code for r in responses)
    print(
        f"\nsilent database: {len(paths)} admin and /ready calls answered {dict(statuses)} "
        f"within {answered_s:.1f} s; {len(outcomes)} requests meanwhile, "
        f"failed {len(failures(outcomes))}, records written {len(rows)}"
    )
    assert set(statuses) == {503}, [r.text[:200] for r in responses if r.status_code != 503]
    assert all(r.json()["error"]["type"] for r in responses)
    assert failures(outcomes) == []
    assert {r["client_request_id"] for r in rows} == {o.request_id for o in outcomes}
