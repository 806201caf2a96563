"""Two gateway replicas on one PostgreSQL schema, in front of the same two simulators.

Per-key limits hold across the replicas within a stated tolerance, a policy change made
through one replica is applied by the other within its `registry_refresh_s`, the hourly
rollups count each request once, and the collectors of both replicas do not store the same
backend's window twice.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from planner.cost import ThroughputCurve
from tests.conftest import POSTGRES_URL
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    Server,
    draftgate_env,
    fleet_backend,
    gateway_env,
    query_rows,
    sim_args,
    spawn_server,
)
from tests.reliability.streaming_load import Outcome, StreamingLoad, failures, stream_once

pytestmark = pytest.mark.postgres

LIMITS_SYNC_S = 1.0
REGISTRY_REFRESH_S = 2.0
LEDGER_FLUSH_S = 0.2
COLLECT_INTERVAL_S = 0.5
MEASUREMENT_WINDOW_S = 4.0
REPLICAS = 2
# Each replica gets one client that waits PAUSE_S between requests: at most this many
# requests per second per replica, which is what bounds the tolerances below.
PAUSE_S = 0.25
RATE_PER_REPLICA = 1 / PAUSE_S
# A replica may admit what the other admitted since that one's last push before our last
# read: two sync intervals, plus one more for a busy machine's late thread. Per replica.
RPM_LIMIT = 40
RPM_TOLERANCE = math.ceil(REPLICAS * RATE_PER_REPLICA * 3 * LIMITS_SYNC_S)  # 24 requests
# Spend reaches the other replica through the ledger (flush) and its registry (refresh);
# requests in flight when the budget runs out finish too (one per client).
BUDGET_REQUESTS = 30
BUDGET_TOLERANCE_REQUESTS = math.ceil(
    REPLICAS * RATE_PER_REPLICA * (REGISTRY_REFRESH_S + 2 * LEDGER_FLUSH_S + 1.0) + REPLICAS
)  # 30 requests
# A request is admitted only while its worst case fits what is left (its prompt's estimate,
# about 50 tokens for this ~200-byte body, plus its 16 max tokens, against the 16 it is
# charged for), so spend may stop short of the budget by one worst case: under 5 requests.
RESERVE_REQUESTS = 5
PROPAGATION_MARGIN_S = 5.0  # beyond registry_refresh_s, for a busy machine
PRICE_USD_PER_GPU_HOUR = 5.0
WAIT_S = 60.0
RPM_RUN_S = 45.0  # the longest a rate-limit run may take: it must fit in one clock minute
REFUSED_FOR_S = 4 * LIMITS_SYNC_S
IMMEDIATE = {"immediate": "true"}  # a move of all traffic at once
PINNED_PLAIN = {"mode": "pinned", "method": "plain"}


@dataclass
class Replicas:
    """Two gateways on one schema, and the schema's URL for direct reads."""

    a: Server
    b: Server
    database_url: str

    def admin(self, server: Server) -> httpx.Client:
        """An admin client for one replica."""
        return server.client(ADMIN_TOKEN)


def schema_url(schema: str) -> str:
    """The URL of the test PostgreSQL that selects `schema`."""
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """A plain and a p-eagle sim, and two gateways on a fresh PostgreSQL schema."""
    schema = f"t_replicas_{uuid.uuid4().hex[:12]}"  # one schema for the whole module
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    log_dir = tmp_path_factory.mktemp("replicas")
    servers: list[Server] = []
    try:
        servers += [
            spawn_server(
                sim_args("--time-scale", "5", "--method", method), draftgate_env(), log_dir
            )
            for method in ("plain", "p-eagle")
        ]
        for sim in servers:
            sim.wait_healthy()
        fleet = _write_fleet(log_dir / "fleet.yaml", servers[0], servers[1])
        env = gateway_env(
            schema_url(schema),
            fleet,
            REQUIRE_API_KEY="true",
            LIMITS_SYNC_S=str(LIMITS_SYNC_S),
            REGISTRY_REFRESH_S=str(REGISTRY_REFRESH_S),
            LEDGER_FLUSH_INTERVAL_S=str(LEDGER_FLUSH_S),
            COLLECT_INTERVAL_S=str(COLLECT_INTERVAL_S),
            MEASUREMENT_WINDOW_S=str(MEASUREMENT_WINDOW_S),
            MEASUREMENT_MIN_REQUESTS="1",  # each window is stored: the test counts them
            MEASUREMENT_MIN_OUTPUT_TOKENS="1",
        )
        gateways = []
        for _ in range(REPLICAS):  # one after the other: the first migrates the schema
            gateways.append(spawn_server(("gateway",), env, log_dir))
            servers.append(gateways[-1])
            gateways[-1].wait_healthy()
        yield Replicas(gateways[0], gateways[1], schema_url(schema))
    finally:
        for server in servers:
            server.close()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _write_fleet(path: Path, plain: Server, speculative: Server) -> Path:
    document = {
        "backends": [
            fleet_backend("plain-1", plain.base_url),
            fleet_backend("peagle-1", speculative.base_url, "p-eagle"),
        ],
        "models": [{"name": SIM_MODEL, "policy": PINNED_PLAIN}],
        "prices": [
            {
                "gpu_type": "B200",
                "kind": "on-demand",
                "usd_per_gpu_hour": PRICE_USD_PER_GPU_HOUR,
                "source": "test",
                "date": "2026-01-01",
            }
        ],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def create_key(replicas: Replicas, name: str, **limits: Any) -> tuple[int, str]:
    """Create a key through replica A and wait until replica B knows it; (id, secret)."""
    with replicas.admin(replicas.a) as http:
        response = http.post("/admin/v1/keys", json={"name": name} | limits)
        assert response.status_code == 201, response.text
        created = response.json()
    headers = {"Authorization": f"Bearer {created['key']}"}
    deadline = time.monotonic() + WAIT_S
    while httpx.get(f"{replicas.b.base_url}/v1/models", headers=headers).status_code != 200:
        assert time.monotonic() < deadline, "replica B never learnt the new key"
        time.sleep(0.2)
    return created["id"], created["key"]


def create_team(replicas: Replicas, name: str, **limits: Any) -> int:
    """Create a team through replica A; its id (keys created after it reach B with it)."""
    with replicas.admin(replicas.a) as http:
        response = http.post("/admin/v1/teams", json={"name": name} | limits)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def paced_load_until_refused(
    replicas: Replicas, key: str | tuple[str, str], most_s: float
) -> list[Outcome]:
    """One paced client per replica (with `key`, or each with its own of two) until
    REFUSED_FOR_S after the first 429 (or `most_s`).

    Going on after the first refusal shows whether the replicas keep refusing once their
    counts are shared; stopping on it keeps the run short on a fast machine and long enough
    on a slow one.
    """
    urls = [replicas.a.base_url, replicas.b.base_url]
    keys = (key, key) if isinstance(key, str) else key
    loads = [
        StreamingLoad([url], SIM_MODEL, 1, api_key=k, pause_s=PAUSE_S)
        for url, k in zip(urls, keys, strict=True)
    ]
    for load in loads:
        load.start()
    started, refused_at = time.monotonic(), None
    while time.monotonic() - started < most_s:
        if refused_at is None and any(load.count(lambda o: o.status == 429) for load in loads):
            refused_at = time.monotonic()
        if refused_at is not None and time.monotonic() - refused_at >= REFUSED_FOR_S:
            break
        time.sleep(0.1)
    return [o for load in loads for o in load.stop()]


def wait_for_minute_room(seconds: float) -> None:
    """Sleep into the next minute unless `seconds` fit in the current one (limits are per
    clock minute)."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.5)


def key_totals(replicas: Replicas, key_id: int, group: str = "key") -> dict[str, Any]:
    """Requests, tokens and cost of one key (or of the `group` with that id: a team) from
    the admin savings rollups (via B)."""
    with replicas.admin(replicas.b) as http:
        response = http.get("/admin/v1/savings", params={"group_by": group})
    assert response.status_code == 200, response.text
    rows = [r for r in response.json()["data"] if r[group] == key_id]
    assert len(rows) <= 1
    return rows[0] if rows else {"requests": 0, "completion_tokens": 0, "cost_usd": 0.0}


def wait_for_key_requests(
    replicas: Replicas, key_id: int, requests: int, group: str = "key"
) -> dict[str, Any]:
    """Poll the rollups until they hold `requests` of the key (or of the `group` with that
    id) or time out; the totals."""
    deadline = time.monotonic() + WAIT_S
    while (totals := key_totals(replicas, key_id, group))["requests"] < requests:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return totals


def test_requests_per_minute_hold_across_replicas(replicas: Replicas) -> None:
    """Both replicas together admit at most the limit plus RPM_TOLERANCE in a minute."""
    _, key = create_key(replicas, "rpm", requests_per_minute=RPM_LIMIT)
    wait_for_minute_room(RPM_RUN_S)
    outcomes = paced_load_until_refused(replicas, key, RPM_RUN_S - 5)
    admitted = Counter(int(o.started_s // 60) for o in outcomes if o.status == 200)
    refused = [o for o in outcomes if o.status == 429]
    by_replica = Counter(o.base_url for o in outcomes if o.status == 200)
    print(
        f"\nrpm limit {RPM_LIMIT} across {REPLICAS} replicas (sync {LIMITS_SYNC_S} s): "
        f"sent {len(outcomes)}, admitted per minute {dict(admitted)}, by replica "
        f"{sorted(by_replica.values())}, refused {len(refused)}, tolerance {RPM_TOLERANCE}"
    )
    assert refused, "the limit never refused anything"
    assert {o.status for o in outcomes} <= {200, 429}
    assert max(admitted.values()) >= RPM_LIMIT
    assert max(admitted.values()) <= RPM_LIMIT + RPM_TOLERANCE
    assert len(by_replica) == REPLICAS


def test_budget_holds_across_replicas(replicas: Replicas) -> None:
    """Spend stops within BUDGET_TOLERANCE_REQUESTS requests' cost of the budget."""
    probe_id, probe_key = create_key(replicas, "price-probe")
    with httpx.Client(timeout=60.0) as http:
        probe = stream_once(http, replicas.a.base_url, SIM_MODEL, 16, probe_key)
    assert probe.completed, probe
    per_request_usd = wait_for_key_requests(replicas, probe_id, 1)["cost_usd"]
    assert per_request_usd > 0, "requests are not priced: the budget test would prove nothing"
    budget_usd = BUDGET_REQUESTS * per_request_usd
    key_id, key = create_key(replicas, "budget", budget_usd=budget_usd, budget_period="total")
    outcomes = paced_load_until_refused(replicas, key, WAIT_S)
    served = [o for o in outcomes if o.status == 200]
    totals = wait_for_key_requests(replicas, key_id, len(outcomes))
    print(
        f"\nbudget ${budget_usd:.6f} (~{BUDGET_REQUESTS} requests) across {REPLICAS} replicas: "
        f"sent {len(outcomes)}, served {len(served)}, refused "
        f"{sum(o.status == 429 for o in outcomes)}, spent ${totals['cost_usd']:.6f} "
        f"({totals['cost_usd'] / per_request_usd:.1f} requests' worth), "
        f"tolerance {BUDGET_TOLERANCE_REQUESTS} requests"
    )
    assert {o.status for o in outcomes} <= {200, 429}
    assert len(served) < len(outcomes), "the budget never refused anything"
    assert totals["cost_usd"] >= budget_usd - RESERVE_REQUESTS * per_request_usd
    assert totals["cost_usd"] <= budget_usd + BUDGET_TOLERANCE_REQUESTS * per_request_usd


def test_a_teams_limits_hold_across_its_keys_and_the_replicas(replicas: Replicas) -> None:
    """Two keys of one team, each through its own replica: the team's requests per minute,
    then its budget, hold over both within the tolerances of one key's, though neither key
    has a limit of its own."""
    rpm_team = create_team(replicas, "team-rpm", requests_per_minute=RPM_LIMIT)
    keys = tuple(create_key(replicas, f"rpm-{n}", team_id=rpm_team)[1] for n in "ab")
    wait_for_minute_room(RPM_RUN_S)
    outcomes = paced_load_until_refused(replicas, (keys[0], keys[1]), RPM_RUN_S - 5)
    admitted = Counter(int(o.started_s // 60) for o in outcomes if o.status == 200)
    print(
        f"\nteam rpm limit {RPM_LIMIT}, two keys on two replicas: sent {len(outcomes)}, "
        f"admitted per minute {dict(admitted)}, tolerance {RPM_TOLERANCE}"
    )
    assert {o.status for o in outcomes} <= {200, 429}
    assert any(o.status == 429 for o in outcomes), "the team's limit never refused anything"
    assert RPM_LIMIT <= max(admitted.values()) <= RPM_LIMIT + RPM_TOLERANCE

    probe_id, probe_key = create_key(replicas, "team-price-probe")
    with httpx.Client(timeout=60.0) as http:
        assert stream_once(http, replicas.a.base_url, SIM_MODEL, 16, probe_key).completed
    per_request_usd = wait_for_key_requests(replicas, probe_id, 1)["cost_usd"]
    assert per_request_usd > 0, "requests are not priced: the budget test would prove nothing"
    budget_usd = BUDGET_REQUESTS * per_request_usd
    team = create_team(replicas, "team-budget", budget_usd=budget_usd, budget_period="total")
    keys = tuple(create_key(replicas, f"budget-{n}", team_id=team)[1] for n in "ab")
    outcomes = paced_load_until_refused(replicas, (keys[0], keys[1]), WAIT_S)
    totals = wait_for_key_requests(replicas, team, len(outcomes), group="team")
    print(
        f"team budget ${budget_usd:.6f} (~{BUDGET_REQUESTS} requests), two keys on two "
        f"replicas: sent {len(outcomes)}, served {sum(o.status == 200 for o in outcomes)}, "
        f"spent ${totals['cost_usd']:.6f} ({totals['cost_usd'] / per_request_usd:.1f} "
        f"requests' worth), tolerance {BUDGET_TOLERANCE_REQUESTS} requests"
    )
    assert {o.status for o in outcomes} <= {200, 429}
    assert any(o.status == 429 for o in outcomes), "the team's budget never refused anything"
    assert totals["cost_usd"] >= budget_usd - RESERVE_REQUESTS * per_request_usd
    assert totals["cost_usd"] <= budget_usd + BUDGET_TOLERANCE_REQUESTS * per_request_usd


def test_policy_change_through_one_replica_reaches_the_other(replicas: Replicas) -> None:
    """Pinning p-eagle through A (at once, not in steps): A routes by it at once, B within
    its registry refresh."""
    _, key = create_key(replicas, "policy")
    policy = {"mode": "pinned", "method": "p-eagle"}
    http = httpx.Client(timeout=60.0)
    try:
        assert stream_once(http, replicas.b.base_url, SIM_MODEL, 4, key).method == "plain"
        with replicas.admin(replicas.a) as admin:
            response = admin.put(
                f"/admin/v1/models/{SIM_MODEL}/policy", json=policy, params=IMMEDIATE
            )
        assert response.status_code == 200, response.text
        changed = time.monotonic()
        on_a = stream_once(http, replicas.a.base_url, SIM_MODEL, 4, key)
        seen_on_b = []
        while (o := stream_once(http, replicas.b.base_url, SIM_MODEL, 4, key)).method != "p-eagle":
            seen_on_b.append(o.method)
            assert time.monotonic() - changed < WAIT_S, "replica B never applied the policy"
        applied_s = time.monotonic() - changed
        after = [stream_once(http, replicas.b.base_url, SIM_MODEL, 4, key) for _ in range(5)]
    finally:
        http.close()
        with replicas.admin(replicas.a) as admin:
            admin.put(f"/admin/v1/models/{SIM_MODEL}/policy", json=PINNED_PLAIN, params=IMMEDIATE)
    print(
        f"\npolicy change through A: A routed {on_a.method} at once, B applied it after "
        f"{applied_s:.2f} s ({len(seen_on_b)} requests before; registry_refresh_s "
        f"{REGISTRY_REFRESH_S})"
    )
    assert on_a.method == "p-eagle"
    assert set(seen_on_b) <= {"plain"}
    assert applied_s <= REGISTRY_REFRESH_S + PROPAGATION_MARGIN_S
    assert {o.method for o in after} == {"p-eagle"}


def test_rollups_count_each_request_once(replicas: Replicas) -> None:
    """Usage through both replicas: the savings rollups equal what the clients counted."""
    key_id, key = create_key(replicas, "rollups")
    load = StreamingLoad([replicas.a.base_url, replicas.b.base_url], SIM_MODEL, 8, api_key=key)
    load.start()
    time.sleep(8.0)
    outcomes = load.stop()
    totals = wait_for_key_requests(replicas, key_id, len(outcomes))
    time.sleep(2 * LEDGER_FLUSH_S + 1.0)  # anything counted twice would land by now
    totals = key_totals(replicas, key_id)
    client_completion = sum(o.completion_tokens for o in outcomes)
    client_prompt = sum(o.prompt_tokens for o in outcomes)
    records = query_rows(
        replicas.database_url,
        "SELECT count(*) AS n, count(DISTINCT client_request_id) AS ids "
        "FROM usage_records WHERE api_key_id = :k",
        k=key_id,
    )[0]
    print(
        f"\nrollups across {REPLICAS} replicas: client requests {len(outcomes)} "
        f"(failed {len(failures(outcomes))}), completion tokens {client_completion}; "
        f"rollups {totals['requests']} requests, {totals['completion_tokens']} completion "
        f"tokens; records {records['n']} ({records['ids']} distinct ids)"
    )
    assert failures(outcomes) == []
    assert totals["requests"] == len(outcomes) == records["n"] == records["ids"]
    assert totals["completion_tokens"] == client_completion
    assert totals["prompt_tokens"] == client_prompt


def test_collectors_store_each_window_once(replicas: Replicas) -> None:
    """Both replicas scrape the same backends; each backend's windows are stored once.

    Two collectors storing every window would leave about two rows per window, with one of
    the two gaps between them shorter than half a window; one store per window leaves at
    most one row per window, at least half a window apart.
    """
    _, key = create_key(replicas, "collector")
    load = StreamingLoad([replicas.a.base_url], SIM_MODEL, 4, api_key=key).start()
    since = dt.datetime.now(dt.UTC)
    time.sleep(6 * MEASUREMENT_WINDOW_S)
    load.stop()
    sql = (
        "SELECT backend_name, measured_at FROM measurements "
        "WHERE source = 'scrape' AND measured_at >= :t ORDER BY measured_at"
    )
    rows = query_rows(replicas.database_url, sql, t=since)
    elapsed_s = (dt.datetime.now(dt.UTC) - since).total_seconds()
    times: dict[str, list[dt.datetime]] = {}
    for row in rows:
        times.setdefault(str(row["backend_name"]), []).append(row["measured_at"])
    gaps = [(b - a).total_seconds() for ts in times.values() for a, b in itertools.pairwise(ts)]
    most = math.floor(elapsed_s / MEASUREMENT_WINDOW_S) + 2  # the straddling windows
    print(
        f"\ncollectors of {REPLICAS} replicas over {elapsed_s:.0f} s of "
        f"{MEASUREMENT_WINDOW_S:.0f} s windows: scrape measurements per backend "
        f"{ {name: len(ts) for name, ts in times.items()} } (at most {most} allowed), "
        f"gaps {[round(g, 1) for g in gaps]} s"
    )
    assert gaps, "too few scrape measurements stored: the test proves nothing"
    assert max(len(ts) for ts in times.values()) <= most
    assert min(gaps) >= MEASUREMENT_WINDOW_S / 2 - COLLECT_INTERVAL_S


def _usage(replicas: Replicas, key_id: int, since: str) -> list[dict[str, Any]]:
    """A key's priced records since `since`, every page of them."""
    rows: list[dict[str, Any]] = []
    params: dict[str, Any] = {"key": key_id, "from": since, "limit": 1000}
    with replicas.admin(replicas.a) as http:
        while True:
            body = http.get("/admin/v1/usage", params=params).json()
            rows += body["data"]
            if body["next_cursor"] is None:
                break
            params["cursor"] = body["next_cursor"]
    return [r for r in rows if r["outcome"] == "ok" and r["usd_per_mtok"] is not None]


ANSWER = 256  # tokens
STAGGER_S = 2.0  # about one answer's time at this load
# B's requests, about 0.4 s each: the load each replica smooths over about 2 s of scrapes
# differs by their phases, 4% per 2 s (sd over six runs of 30), so 45 s of them average that
# to about 1% of the price.
B_REQUESTS = 120


def _around(rows: list[dict[str, Any]], created_at: str) -> list[dict[str, Any]]:
    """The rows that arrived within half a second of `created_at`, or else the nearest."""
    at = dt.datetime.fromisoformat(created_at)
    apart = [(abs(dt.datetime.fromisoformat(r["created_at"]) - at), r) for r in rows]
    near = [r for d, r in apart if d.total_seconds() <= 0.5]
    return near or [min(apart, key=lambda p: p[0])[1]]


def test_both_replicas_price_a_backend_at_its_whole_load(replicas: Replicas) -> None:
    """Eight streams through A and one at a time through B, to the same plain backend: both
    price its tokens at the backend's load, within 10% of each other at the same instants (B
    priced at its own one request in flight would pay the $/1M of concurrency 1)."""
    id_a, key_a = create_key(replicas, "load-a")
    id_b, key_b = create_key(replicas, "load-b")
    # Long answers, so the clients' own overhead between requests leaves the load steady;
    # staggered starts, so the eight do not finish in lockstep (A's requests would all be
    # priced at the same instants of a load estimate that moves as their latencies land,
    # and B's at others: 5.60 against 6.27 requests once, 7.7% apart).
    load = StreamingLoad([replicas.a.base_url], SIM_MODEL, 8, ANSWER, api_key=key_a,
                         stagger_s=STAGGER_S).start()  # fmt: skip
    try:
        with httpx.Client(timeout=30) as http:
            # B learns the backend's load from its collector's next scrapes (alone, B's one
            # request at a time would be priced at concurrency 1).
            warm = dt.datetime.now(dt.UTC).isoformat()
            deadline = time.monotonic() + WAIT_S
            while not any(float(r["concurrency"]) >= 2 for r in _usage(replicas, id_b, warm)):
                assert time.monotonic() < deadline, "replica B never saw the backend's load"
                stream_once(http, replicas.b.base_url, SIM_MODEL, ANSWER, key_b)
            since = dt.datetime.now(dt.UTC).isoformat()
            b_url = replicas.b.base_url
            # Answers of varied length, so B's requests start at every phase of the load's
            # ripple (with A's length they would all land at one phase of it: 5.40 against
            # 6.08 requests once, and 6.25 against 5.43 another time).
            lengths = random.Random(7).choices(range(ANSWER // 2, 3 * ANSWER // 2), k=B_REQUESTS)
            sent = [stream_once(http, b_url, SIM_MODEL, n, key_b) for n in lengths]
    finally:
        load.stop()
    assert failures(sent) == []
    rows: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + WAIT_S
    while len(rows.get("b", [])) < len(sent):
        assert time.monotonic() < deadline, "B's usage records were not written"
        rows = {"a": _usage(replicas, id_a, since), "b": _usage(replicas, id_b, since)}

    # The load each replica priced at: B's requests, and A's that arrived around each of them
    # (the same instants, so the ripple of the load cancels out); $/1M follows from it on one
    # curve (the curve itself moves while the collector stores this traffic's windows).
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    around = [mean([float(a["concurrency"]) for a in _around(rows["a"], b["created_at"])])
              for b in rows["b"]]  # fmt: skip
    load_of = {"a": mean(around), "b": mean([float(b["concurrency"]) for b in rows["b"]])}
    with replicas.admin(replicas.a) as http:
        curves = http.get("/admin/v1/curves", params={"model": SIM_MODEL}).json()["curves"]
    [plain] = [c for c in curves if c["method"] == "plain"]
    line = ThroughputCurve.from_points(
        [(p["concurrency"], p["output_tokens_per_s"]) for p in plain["line"]]
    )
    price = {n: PRICE_USD_PER_GPU_HOUR / (line.at(c) * 3600) * 1e6 for n, c in load_of.items()}
    print(
        f"\none backend, 8 streams via A and 1 via B: mean priced concurrency A "
        f"{load_of['a']:.2f}, B {load_of['b']:.2f}; $/1M on today's curve A {price['a']:.4f}, "
        f"B {price['b']:.4f} ({len(rows['a'])} and {len(rows['b'])} requests)"
    )
    # Each replica prices at its own collector's last scrape of the backend (every 0.5 s, at
    # phases of their own) of a load that ripples as streams end: 0.2-2% apart alone here,
    # 5.6% once in a whole suite's run. What this guards against, B pricing at its own one
    # request, is 2-3x apart.
    assert price["b"] == pytest.approx(price["a"], rel=0.10)
