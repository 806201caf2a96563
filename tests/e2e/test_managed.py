"""Managed backends: `draftgate up` moves a simulator to another method under steady load."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gateway.db.session import make_engine, make_sessionmaker
from gateway.db.tables import AuditEntry
from gateway.services.spend import spend
from tests.e2e.conftest import (
    Server,
    ServerStarter,
    draftgate_env,
    free_port_block,
    metric_value,
)

MODEL = "openai/gpt-oss-20b"
WORKERS = 6
SWITCH_TIMEOUT_S = 60.0
SERVED_TIMEOUT_S = 60.0
SERVED_EACH = 2 * WORKERS  # requests each method serves under the load, before and after
DFLASH = {"method": "dflash", "k": 7, "drafter": "z-lab/gpt-oss-20b-DFlash"}


@dataclass
class Outcome:
    """One streamed request as the client saw it."""

    ok: bool
    backend: str | None
    detail: str = ""


def _stream_once(http: httpx.Client) -> Outcome:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            text = "".join(response.iter_text())
            backend = response.headers.get("x-draftgate-backend")
            ok = response.status_code == 200 and text.rstrip().endswith("data: [DONE]")
            ok = ok and '"usage"' in text and '"error"' not in text
            return Outcome(ok, backend, "" if ok else f"{response.status_code}: {text[-300:]}")
    except httpx.HTTPError as exc:
        return Outcome(False, None, repr(exc))


def _steady_load(base_url: str, stop: threading.Event) -> list[Outcome]:
    """WORKERS clients streaming back to back until `stop`."""

    def worker() -> list[Outcome]:
        out = []
        with httpx.Client(base_url=base_url, timeout=30.0) as http:
            while not stop.is_set():
                out.append(_stream_once(http))
        return out

    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(worker) for _ in range(WORKERS)]
        return [o for f in futures for o in f.result()]


def _start_up(start_server: ServerStarter, tmp_path: Path) -> tuple[Server, str, int]:
    sim_base = free_port_block(5)
    env = draftgate_env(DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/managed.db")
    server = start_server("up", "--sim-base-port", str(sim_base), "--time-scale", "5",
                          "--no-dashboard", env=env, wait=False)  # fmt: skip
    server.wait_healthy(90.0)  # five simulators, then the gateway, on a busy machine
    token = server.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1)
    return server, token, sim_base


def _wait_until_gone(http: httpx.Client, name: str, server: Server) -> None:
    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    while time.monotonic() < deadline:
        if http.get(f"/admin/v1/backends/{name}").status_code == 404:
            return
        time.sleep(0.2)
    pytest.fail(f"backend {name} still registered after {SWITCH_TIMEOUT_S} s:\n{server.output()}")


def _wait_served(server: Server, method: str, count: int) -> None:
    """Until the gateway has answered `count` more requests by `method` with a 2xx."""

    def served() -> float:
        labels = {"method": method, "status": "2xx"}
        return metric_value(server.base_url, "draftgate_requests_total", **labels)

    wanted, deadline = served() + count, time.monotonic() + SERVED_TIMEOUT_S
    while (seen := served()) < wanted:
        assert time.monotonic() < deadline, f"{method} served {seen} of {wanted} requests"
        time.sleep(0.2)


def _audit(http: httpx.Client, name: str) -> list[dict[str, Any]]:
    entries = http.get("/admin/v1/audit", params={"resource_type": "backend"}).json()["data"]
    return [e for e in entries if e["resource_id"] == name]


def test_managed_simulator_switches_from_eagle3_to_dflash_under_load_with_no_failure(
    start_server: ServerStarter, tmp_path: Path
) -> None:
    server, token, sim_base = _start_up(start_server, tmp_path)
    eagle3_port = sim_base + 1  # demo backends: plain, eagle3, p-eagle, dflash, dspark
    with server.client(token) as admin:
        for method in ("plain", "p-eagle", "dflash", "dspark"):  # eagle3 serves alone
            assert admin.delete(f"/admin/v1/backends/demo-{method}").status_code == 204
        stop = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(_steady_load, server.base_url, stop)
            try:
                _wait_served(server, "eagle3", SERVED_EACH)  # traffic flowing to eagle3
                accepted = admin.post("/admin/v1/backends/demo-eagle3/switch", json=DFLASH)
                assert accepted.status_code == 202, accepted.text
                assert accepted.json()["new_name"] == "demo-dflash-k7"
                _wait_until_gone(admin, "demo-eagle3", server)
                _wait_served(server, "dflash", SERVED_EACH)  # traffic flowing to dflash
            finally:
                stop.set()
            outcomes = load.result()

        failures = [o.detail for o in outcomes if not o.ok]
        assert not failures, failures[:5]
        served = Counter(o.backend for o in outcomes)
        assert set(served) == {"demo-eagle3", "demo-dflash-k7"}, served  # both served

        new = admin.get("/admin/v1/backends/demo-dflash-k7").json()
        assert (new["method"], new["k"], new["managed"], new["enabled"]) == (
            "dflash",
            7,
            True,
            True,
        )
        assert new["speculative_config"]["method"] == "dflash"
        with httpx.Client(base_url=new["url"], timeout=5) as sim:
            assert sim.get("/health").status_code == 200
            assert "vllm:spec_decode_num_drafts_total" in sim.get("/metrics").text
        with pytest.raises(httpx.ConnectError):  # the old server was stopped
            httpx.get(f"http://127.0.0.1:{eagle3_port}/health", timeout=2)
        actions = [e["action"] for e in _audit(admin, "demo-eagle3")]
        assert actions[:3] == ["delete", "switch", "create"] or actions[-3:] == [
            "create",
            "switch",
            "delete",
        ], actions
        switch = next(e for e in _audit(admin, "demo-eagle3") if e["action"] == "switch")
        assert switch["before"]["method"] == "eagle3"
        assert switch["after"]["name"] == "demo-dflash-k7"
    assert server.stop(signal.SIGINT, timeout_s=30) == 0, server.output()
    with pytest.raises(httpx.ConnectError):  # the switched-in server stopped with the stack
        httpx.get(f"{new['url']}/health", timeout=2)


def test_only_backends_this_process_started_can_be_switched(
    start_server: ServerStarter, tmp_path: Path
) -> None:
    server, token, _ = _start_up(start_server, tmp_path)
    with server.client(token) as admin:
        external = {
            "name": "outside",
            "url": "http://127.0.0.1:9",
            "model": MODEL,
            "method": "plain",
        }
        assert admin.post("/admin/v1/backends", json=external).status_code == 201
        refused = admin.post("/admin/v1/backends/outside/switch", json={"method": "eagle3"})
        assert refused.status_code == 409, refused.text
        assert "not managed" in refused.json()["error"]["message"]
        missing = admin.post("/admin/v1/backends/nope/switch", json={"method": "eagle3"})
        assert missing.status_code == 404
        bad = admin.post("/admin/v1/backends/demo-plain/switch", json={"method": "eagle3", "k": 0})
        assert bad.status_code == 422, bad.text
        taken = admin.post(
            "/admin/v1/backends/demo-plain/switch", json={**DFLASH, "name": "demo-eagle3"}
        )
        assert taken.status_code == 409
    assert server.stop(signal.SIGINT, timeout_s=30) == 0, server.output()
    _assert_stopped_backends_are_no_longer_billed(tmp_path / "managed.db")


def _assert_stopped_backends_are_no_longer_billed(db: Path) -> None:
    """After `up` exits, the servers it started are disabled: spend stops accruing for
    them, and only the external backend is still held."""
    engine = make_engine(f"sqlite:///{db}")
    try:
        with make_sessionmaker(engine)() as session:
            at_exit = spend(session, None, None, "on-demand")
            time.sleep(1.0)  # time passes: what is still held accrues, nothing else
            later = spend(session, None, None, "on-demand")
            stops = session.scalars(select(AuditEntry).where(AuditEntry.action == "stop"))
            stopped = {e.resource_id for e in stops}
    finally:
        engine.dispose()
    assert stopped == {f"demo-{m}" for m in ("plain", "eagle3", "p-eagle", "dflash", "dspark")}
    hours = {r.backend: r.gpu_hours for r in at_exit.data}
    for row in later.data:
        if row.backend == "outside":  # registered and enabled: held until removed
            assert row.gpu_hours > hours["outside"]
        else:
            assert row.gpu_hours == hours[row.backend]
