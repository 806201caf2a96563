"""Drafters and engine versions are dimensions of a curve, against a real simulator and gateway.

The simulator reports the engine version it is started with (`/version`, as vLLM serves it).
Restarted on the same address as another version (an in-place upgrade), the collector reads
the new version, the audit log shows the change, its windows no longer mix into the old
version's curve, and the curve's own points come from the new version's traffic alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import (
    ADMIN,
    Server,
    draftgate_env,
    fleet_backend,
    free_port,
    gateway_env,
    metric_value,
    query_rows,
    sim_args,
    spawn_server,
    until,
    write_fleet,
)

BACKEND, DRAFTER = "sim-pe", "amazon/GPT-OSS-20B-P-EAGLE"
SIM = ("--method", "p-eagle", "--k", "7", "--time-scale", "10")
CHAT = {"model": "openai/gpt-oss-20b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 48, "ignore_eos": True}  # fmt: skip
# Windows of 1.5 s hold a few requests each: the gate is lowered to store them.
SETTINGS = {"COLLECT_INTERVAL_S": "0.3", "MEASUREMENT_WINDOW_S": "1.5", "REGISTRY_REFRESH_S": "0.5",
            "MEASUREMENT_MIN_REQUESTS": "1", "MEASUREMENT_MIN_OUTPUT_TOKENS": "1"}  # fmt: skip


def _sim(tmp_path: Path, port: int, version: str) -> Server:
    sim = spawn_server(
        sim_args(*SIM, "--engine-version", version), draftgate_env(), tmp_path, port=port
    )
    sim.wait_healthy()
    return sim


def _backend(gateway: Server) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(
        f"{gateway.base_url}/admin/v1/backends/{BACKEND}", headers=ADMIN
    ).json()
    return found


def _audited(gateway: Server) -> list[tuple[str, Any, Any]]:
    """The collector's audit entries of the backend: an upgrade each (the first read is no
    change of configuration)."""
    audit = httpx.get(
        f"{gateway.base_url}/admin/v1/audit",
        params={"resource_type": "backend", "resource_id": BACKEND},
        headers=ADMIN,
    ).json()["data"]
    return [(e["action"], e["before"], e["after"]) for e in audit if e["actor"] == "collector"]


def _curve(gateway: Server) -> dict[str, Any]:
    curves = httpx.get(
        f"{gateway.base_url}/admin/v1/curves", params={"model": CHAT["model"]}, headers=ADMIN
    ).json()["curves"]
    [curve] = [c for c in curves if c["method"] == "p-eagle"]
    return curve  # type: ignore[no-any-return]


def _measured(database_url: str, version: str) -> list[dict[str, Any]]:
    sql = "SELECT drafter, engine_version FROM measurements WHERE engine_version = :v"
    return query_rows(database_url, sql, v=version)


def _traffic_until(gateway: Server, done: Any, what: str) -> Any:
    """Requests until `done()` holds (the windows close and land when they do)."""
    with httpx.Client(base_url=gateway.base_url, timeout=30) as http:

        def served() -> Any:
            for _ in range(4):
                assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
            return done()

        return until(served, what)


def test_an_engine_upgrade_is_read_audited_and_starts_the_curve_again(tmp_path: Path) -> None:
    port = free_port()
    sim = _sim(tmp_path, port, "0.32.0")
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend(BACKEND, sim.base_url, "p-eagle")])
    database_url = f"sqlite:///{tmp_path}/draftgate.db"
    gateway = spawn_server(("gateway",), gateway_env(database_url, fleet, **SETTINGS), tmp_path)
    try:
        gateway.wait_healthy()
        until(
            lambda: _backend(gateway)["runtime"]["engine_version"] == "0.32.0", "the version read"
        )
        info = lambda v: metric_value(  # noqa: E731
            gateway.base_url, "draftgate_backend_info", backend=BACKEND, engine_version=v
        )
        until(lambda: info("0.32.0") == 1, "the backend's info series")
        assert metric_value(gateway.base_url, "draftgate_backend_info", drafter=DRAFTER) == 1
        old = _traffic_until(gateway, lambda: _measured(database_url, "0.32.0"), "0.32.0 windows")
        assert {(r["drafter"], r["engine_version"]) for r in old} == {(DRAFTER, "0.32.0")}
        until(lambda: _curve(gateway)["measured"], "the curve measured on 0.32.0")

        sim.close()  # upgraded in place: the same address, another engine
        sim = _sim(tmp_path, port, "0.33.1")
        until(
            lambda: _backend(gateway)["runtime"]["engine_version"] == "0.33.1",
            "the new version read",
        )
        until(lambda: _backend(gateway)["runtime"]["healthy"], "the backend healthy again")
        until(lambda: (info("0.33.1"), info("0.32.0")) == (1, 0), "the info series moved")
        upgrade = ("update", {"engine_version": "0.32.0"}, {"engine_version": "0.33.1"})
        until(lambda: _audited(gateway) == [upgrade], "the upgrade audited, and only it")
        # the old version's windows no longer shape the curve: it is the planner's estimate
        # (a window open at the restart may land after it, as 0.32.0's)
        superseded = lambda: _curve(gateway)["rejected"].get("superseded")  # noqa: E731
        until(lambda: superseded() == len(_measured(database_url, "0.32.0")), "0.32.0 superseded")
        stored, curve = len(_measured(database_url, "0.32.0")), _curve(gateway)
        assert curve["measured"] == []
        new = _traffic_until(gateway, lambda: _measured(database_url, "0.33.1"), "0.33.1 windows")
        assert {(r["drafter"], r["engine_version"]) for r in new} == {(DRAFTER, "0.33.1")}
        curve = until(lambda: (c := _curve(gateway))["measured"] and c, "measured on 0.33.1")
        assert curve["rejected"]["superseded"] >= stored
        assert sum(p["points"] for p in curve["measured"]) <= len(_measured(database_url, "0.33.1"))
    finally:
        gateway.close()
        sim.close()
