"""Quality gates against real simulators: a burst of short test requests moves no price.

Steady streams through the gateway become collector measurements; then ten `max_tokens: 4`
requests per method, as a new user trying the stack sends. Their windows are too thin to be
measurements: they are counted as rejected, stored nowhere, and every method's $/1M on the
curves that price requests stays where the steady traffic put it.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from planner.cost import ThroughputCurve
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    query_rows,
    sim_args,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WINDOW_S = 2.0
# The default gates (10 requests, 500 output tokens per window); only the clocks are short.
SETTINGS = {"COLLECT_INTERVAL_S": "0.3", "MEASUREMENT_WINDOW_S": str(WINDOW_S),
            "REGISTRY_REFRESH_S": "0.5"}  # fmt: skip
WAIT_S = 60.0  # deadline of every poll: windows close late on a busy machine
METHODS = ("plain", "p-eagle")
REJECTED = "draftgate_measurement_windows_rejected_total"


@pytest.fixture(scope="module")
def stack(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> tuple[Server, str]:
    fast = ("--time-scale", "10", "--workload", "chat")
    plain, peagle = start_module_servers(
        sim_args(*fast), sim_args("--method", "p-eagle", "--k", "7", *fast)
    )
    backends = [
        fleet_backend("g-plain", plain.base_url),
        fleet_backend("g-peagle", peagle.base_url, "p-eagle"),
    ]
    return start_module_gateway(backends, **SETTINGS)


def _chat(http: httpx.Client, max_tokens: int) -> str:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "ignore_eos": True}  # fmt: skip
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.headers["x-draftgate-method"]


def _steady(server: Server, clients: int, stop: threading.Event) -> None:
    def client() -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            while not stop.is_set():
                _chat(http, 128)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _scrape_rows(database_url: str) -> list[dict[str, object]]:
    return query_rows(
        database_url,
        "SELECT id, method, requests, mean_output_tokens FROM measurements "
        "WHERE source = 'scrape' ORDER BY id",
    )


def _prices(server: Server) -> dict[tuple[str, float], float]:
    body = httpx.get(
        f"{server.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
    ).json()
    return {
        (c["method"], p["concurrency"]): p["usd_per_mtok"]
        for c in body["curves"]
        for p in c["line"]
        if p["usd_per_mtok"] is not None
    }


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_burst_of_short_requests_moves_no_price(stack: tuple[Server, str]) -> None:
    server, database_url = stack
    policy = {"mode": "auto", "explore_fraction": 0.5}  # both methods get traffic
    httpx.put(
        f"{server.base_url}/admin/v1/models/{SIM_MODEL}/policy", json=policy, headers=ADMIN
    ).raise_for_status()
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=ADMIN)

    stop = threading.Event()
    load = threading.Thread(target=_steady, args=(server, 8, stop))
    load.start()
    try:
        _until(
            lambda: {r["method"] for r in _scrape_rows(database_url)} >= set(METHODS),
            "steady traffic never became measurements of both methods",
        )
    finally:
        stop.set()
        load.join()
    steady_rows = _scrape_rows(database_url)
    assert all(int(r["requests"]) >= 10 for r in steady_rows), steady_rows  # type: ignore[call-overload]

    # Quiet until the last window with steady traffic has been written and read.
    def quiet() -> bool:
        rows = _scrape_rows(database_url)
        time.sleep(WINDOW_S + 1.0)
        return _scrape_rows(database_url) == rows

    _until(quiet, "the collector kept storing windows with no traffic")
    _until(lambda: _prices(server), "no priced curve")
    before, last_id = _prices(server), max(int(r["id"]) for r in _scrape_rows(database_url))  # type: ignore[call-overload]
    rejected_before = {m: metric_value(server.base_url, REJECTED, backend=b)
                       for m, b in (("plain", "g-plain"), ("p-eagle", "g-peagle"))}  # fmt: skip

    sent: Counter[str] = Counter()
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        while min(sent[m] for m in METHODS) < 10:
            sent[_chat(http, 4)] += 1
    _until(
        lambda: all(
            metric_value(server.base_url, REJECTED, backend=b) > rejected_before[m]
            for m, b in (("plain", "g-plain"), ("p-eagle", "g-peagle"))
        ),
        "the burst's windows were not counted as rejected",
    )
    stored = [r for r in _scrape_rows(database_url) if int(r["id"]) > last_id]  # type: ignore[call-overload]
    assert stored == [], stored  # the burst is in no measurement
    after = _prices(server)
    assert after.keys() == before.keys()
    moved = {key: after[key] / before[key] - 1 for key in before}
    assert all(abs(m) <= 0.05 for m in moved.values()), moved


def test_every_request_is_priced_from_the_curves_the_api_shows(stack: tuple[Server, str]) -> None:
    server, _ = stack
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=ADMIN)  # 409 if there
    _until(lambda: _prices(server), "no priced curve")
    since = dt.datetime.now(dt.UTC).isoformat()
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        ids = {_request_id(http) for _ in range(12)}
    rows: list[dict[str, object]] = []

    def recorded() -> bool:
        nonlocal rows
        params = {"model": SIM_MODEL, "from": since, "limit": 1000}
        usage = httpx.get(f"{server.base_url}/admin/v1/usage", params=params, headers=ADMIN)
        rows = [r for r in usage.json()["data"] if r["client_request_id"] in ids]
        return len(rows) == len(ids)

    _until(recorded, "the requests' usage records were not written")
    curves = httpx.get(
        f"{server.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
    ).json()["curves"]
    lines = {
        c["method"]: ThroughputCurve.from_points(
            [(p["concurrency"], p["output_tokens_per_s"]) for p in c["line"]]
        )
        for c in curves
    }
    by_method = {c["method"]: c for c in curves}
    for r in rows:
        # Recomputed from outside: the curve of its method at its concurrency, at $6/GPU-hour,
        # and the half-width of its cost from that curve's band at that concurrency.
        # Output at the curve with its own prefill taken out, the prompt at its prefill price.
        c = float(r["concurrency"])  # type: ignore[arg-type]
        curve = by_method[str(r["method"])]
        tps = lines[str(r["method"])].at(c)
        prompt_price = curve["prompt_usd_per_mtok"]
        assert prompt_price is not None
        assert r["prompt_usd_per_mtok"] == pytest.approx(prompt_price)
        output_price = (
            6.0 / (tps * 3600) * 1e6 - curve["prompt_tokens_per_output_token"] * prompt_price
        )
        # plus its own context's correction (docs/costs.md), shown on the record
        context = float(r["context_usd"])  # type: ignore[arg-type]
        completion = int(r["completion_tokens"])  # type: ignore[call-overload]
        applied = output_price + context * 1e6 / completion
        assert r["usd_per_mtok"] == pytest.approx(applied, rel=1e-6), r
        tokens = completion * output_price + r["prompt_tokens"] * prompt_price  # type: ignore[operator]
        assert r["cost_usd"] == pytest.approx(tokens / 1e6 + context, rel=1e-6), r
        assert r["curve_source"] in ("measured", "estimated")
        half = _band_at(by_method[str(r["method"])], c, str(r["curve_source"]))
        planner = float(curve["estimated_relative_95"])
        error = (tokens / 1e6) * half + abs(context) * planner
        assert r["cost_error_usd"] == pytest.approx(error, rel=1e-6), r


def _band_at(curve: dict[str, Any], c: float, source: str) -> float:
    """A curve's relative 95% half-width at c, from its line as the API shows it."""
    if source == "estimated":
        return float(curve["estimated_relative_95"])
    measured = [
        (p["concurrency"], p["relative_95"]) for p in curve["line"] if p["source"] == "measured"
    ]
    c = max(c, 1.0)
    for (c0, h0), (c1, h1) in itertools.pairwise(measured):
        if c0 <= c <= c1:
            return float(h0 + (h1 - h0) * (c - c0) / (c1 - c0))
    return float(measured[0][1])


def _request_id(http: httpx.Client) -> str:
    rid = uuid.uuid4().hex
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16, "ignore_eos": True}  # fmt: skip
    response = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
    assert response.status_code == 200, response.text
    return rid


def test_a_long_prompt_with_a_short_answer_pays_for_its_prefill(stack: tuple[Server, str]) -> None:
    """Prompt tokens cost GPU time: a long prompt answered in 4 tokens costs more than a
    short one answered alike, by its extra prompt tokens at the prefill price."""
    server, _ = stack
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=ADMIN)  # 409 if there
    _until(lambda: _prices(server), "no priced curve")
    ids: dict[str, str] = {}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for name, words in (("short", 1), ("long", 3000)):
            rid = uuid.uuid4().hex
            message = {"role": "user", "content": " ".join(["word"] * words)}
            body = {"model": SIM_MODEL, "max_tokens": 4, "ignore_eos": True,
                    "messages": [message]}  # fmt: skip
            response = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
            assert response.status_code == 200, response.text
            ids[name] = rid
    rows: dict[str, dict[str, Any]] = {}

    def recorded() -> bool:
        usage = httpx.get(f"{server.base_url}/admin/v1/usage", params={"limit": 1000},
                          headers=ADMIN).json()["data"]  # fmt: skip
        found = {r["client_request_id"]: r for r in usage}
        rows.update({name: found[rid] for name, rid in ids.items() if rid in found})
        return len(rows) == len(ids)

    _until(recorded, "the requests' usage records were not written")
    short, long = rows["short"], rows["long"]
    assert long["prompt_tokens"] > short["prompt_tokens"] + 2000
    prompt_price = long["prompt_usd_per_mtok"]
    assert prompt_price > 0
    output = [r["completion_tokens"] * r["usd_per_mtok"] / 1e6 for r in (short, long)]
    for row, out in zip((short, long), output, strict=True):
        assert row["cost_usd"] == pytest.approx(out + row["prompt_tokens"] * prompt_price / 1e6)
    extra = (long["prompt_tokens"] - short["prompt_tokens"]) * prompt_price / 1e6
    assert long["cost_usd"] - output[1] == pytest.approx(short["cost_usd"] - output[0] + extra)
    # Prefill is the same for plain: it is in both costs and never in the saving.
    for row in (short, long):
        saving = row["baseline_cost_usd"] - row["cost_usd"]
        plain_output = row["completion_tokens"] * row["baseline_usd_per_mtok"] / 1e6
        assert saving == pytest.approx(
            plain_output - row["completion_tokens"] * row["usd_per_mtok"] / 1e6
        )
