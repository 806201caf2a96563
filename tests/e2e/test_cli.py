"""The `draftgate` console script end to end: real processes, real sockets, real databases."""

from __future__ import annotations

import datetime as dt
import json
import re
import resource
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, inspect, text

from gateway.db.base import Base
from gateway.db.tables import Measurement
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    DRAFTGATE,
    CliRunner,
    Server,
    ServerStarter,
    draftgate_env,
    free_port,
    free_port_block,
    metric_value,
    sqlalchemy_url,
)
from tests.unit.test_predict import EXAMPLE

BACKEND = {
    "name": "qwen-eagle3",
    "url": "http://127.0.0.1:8102",
    "model": "Qwen/Qwen3-8B",
    "method": "eagle3",
    "k": 3,
    "drafter": "RedHatAI/Qwen3-8B-speculator.eagle3",
}
SPECULATIVE_CONFIG = {
    "method": "eagle3",
    "model": "RedHatAI/Qwen3-8B-speculator.eagle3",
    "num_speculative_tokens": 3,
}
SHUTDOWN_TIMEOUT_S = 15.0  # graceful, but on a busy two-core machine


def _table_names(database_url: str) -> set[str]:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _assert_openai_error(body: Any) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]


def _create_backend_and_check_audit(server: Server, token: str) -> None:
    """POST a backend, read it back, and find its creation in the audit log."""
    with server.client(token) as http:
        created = http.post("/admin/v1/backends", json=BACKEND)
        assert created.status_code == 201, created.text
        assert created.json()["speculative_config"] == SPECULATIVE_CONFIG

        listed = http.get("/admin/v1/backends")
        assert listed.status_code == 200
        (backend,) = [b for b in listed.json()["data"] if b["name"] == BACKEND["name"]]
        assert {k: backend[k] for k in BACKEND} == BACKEND

        params = {"resource_type": "backend", "resource_id": BACKEND["name"]}
        audit = http.get("/admin/v1/audit", params=params)
        assert audit.status_code == 200
        (entry,) = audit.json()["data"]
    assert (entry["action"], entry["resource_type"], entry["resource_id"]) == (
        "create",
        "backend",
        "qwen-eagle3",
    )
    assert entry["before"] is None
    assert {k: entry["after"][k] for k in BACKEND} == BACKEND


# --- draftgate db upgrade ---------------------------------------------------------------


def test_db_upgrade_creates_schema_once(run_cli: CliRunner, database_url: str) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)

    first = run_cli("db", "upgrade", env=env)
    assert first.returncode == 0, first.stderr
    assert re.search(r"upgraded from empty to revision \S+", first.stdout), first.stdout

    second = run_cli("db", "upgrade", env=env)
    assert second.returncode == 0, second.stderr
    assert "already at revision" in second.stdout
    assert "upgraded" not in second.stdout

    tables = _table_names(database_url)
    assert set(Base.metadata.tables) <= tables
    assert "alembic_version" in tables


# --- draftgate gateway ------------------------------------------------------------------


def test_gateway_serves_admin_api_and_stops_on_sigterm(
    start_server: ServerStarter, database_url: str
) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url, DRAFTGATE_ADMIN_TOKEN=ADMIN_TOKEN)
    server = start_server("gateway", env=env)

    _create_backend_and_check_audit(server, ADMIN_TOKEN)
    with server.client() as anonymous:
        refused = anonymous.get("/admin/v1/backends")
    assert refused.status_code == 401
    _assert_openai_error(refused.json())
    with server.client("not-the-admin-token-at-all") as wrong:
        assert wrong.get("/admin/v1/backends").status_code == 401

    code = server.stop(signal.SIGTERM, timeout_s=SHUTDOWN_TIMEOUT_S)
    assert code == 0, server.output()


def test_gateway_without_admin_token_refuses_to_start(run_cli: CliRunner, tmp_path: Path) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/draftgate.db")
    result = run_cli("gateway", "--port", "1", env=env)
    assert result.returncode == 2
    assert "DRAFTGATE_ADMIN_TOKEN" in result.stderr


def test_gateway_refuses_placeholder_admin_token(run_cli: CliRunner, tmp_path: Path) -> None:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/draftgate.db",
        DRAFTGATE_ADMIN_TOKEN="changeme",
    )
    result = run_cli("gateway", "--port", "1", env=env)
    assert result.returncode == 2
    assert "placeholder" in result.stderr
    assert "changeme" not in result.stderr  # the secret is never echoed


def _low_open_files_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def _soft_open_files(pid: int) -> int:
    line = next(
        r for r in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in r
    )
    return int(line.split()[3])


def test_gateway_lifts_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    """Two sockets per stream: a soft limit of 256 would cut the replica off near 128."""
    port = free_port()
    env = draftgate_env(DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/fd.db",
                        DRAFTGATE_ADMIN_TOKEN=ADMIN_TOKEN)  # fmt: skip
    with (tmp_path / "gateway.log").open("wb") as log:
        process = subprocess.Popen(
            [str(DRAFTGATE), "gateway", "--port", str(port)], env=env, cwd=tmp_path,
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_low_open_files_limit,
        )  # fmt: skip
        try:
            server = Server(process=process, port=port, log_path=tmp_path / "gateway.log",
                            log_file=log)  # fmt: skip
            server.wait_healthy()
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            assert _soft_open_files(process.pid) == hard != 256
            assert "open-file limit raised from 256" in server.output()
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_gateway_dev_mode_accepts_placeholder_token(
    start_server: ServerStarter, tmp_path: Path
) -> None:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/draftgate.db",
        DRAFTGATE_ADMIN_TOKEN="changeme",
        DRAFTGATE_DEV_MODE="true",
    )
    server = start_server("gateway", env=env)
    with server.client("changeme") as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/admin/v1/backends").json() == {"object": "list", "data": []}


# --- draftgate up -----------------------------------------------------------------------


def _start_up(start_server: ServerStarter, database_url: str) -> tuple[Server, str]:
    sim_base = free_port_block(5)
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    server = start_server("up", "--sim-base-port", str(sim_base), "--time-scale", "20",
                          "--no-dashboard", env=env)  # fmt: skip
    token = server.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1)
    return server, token


def _sim_ports(server: Server) -> list[int]:
    """The ports of the simulated backends `up` printed."""
    return [int(p) for p in re.findall(r"demo-\S+\s+http://127\.0\.0\.1:(\d+)", server.output())]


def test_up_keeps_its_token_and_database_and_logs_the_gateway(
    start_server: ServerStarter, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path}/up.db"
    server, token = _start_up(start_server, database_url)
    assert len(token) >= 32
    kept = tmp_path / ".draftgate" / "admin-token"
    kept_at = server.wait_for_output(r"^\s*token from\s+(\S+) \(mode 600").group(1)
    assert kept_at == str(Path(".draftgate") / "admin-token")
    assert kept.read_text().strip() == token
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    gateway_log = tmp_path / ".draftgate" / "logs" / "gateway.log"
    assert "Application startup complete" in gateway_log.read_text()
    assert token not in gateway_log.read_text()
    _create_backend_and_check_audit(server, token)
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        chat = {
            "model": "openai/gpt-oss-20b",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
        }
        answer = http.post("/v1/chat/completions", json=chat)  # no API key in the demo
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-draftgate-backend"].startswith("demo-")
    ports = _sim_ports(server)
    assert len(ports) == 5
    assert server.stop(signal.SIGINT, timeout_s=SHUTDOWN_TIMEOUT_S) == 0, server.output()
    for port in ports:  # Ctrl-C stopped the simulators too
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)

    again, same_token = _start_up(start_server, database_url)
    assert same_token == token  # a restart keeps the token scripts and dashboards hold
    with again.client(token) as http:
        names = [b["name"] for b in http.get("/admin/v1/backends").json()["data"]]
        keys = http.get("/admin/v1/keys", params={"include_revoked": True}).json()["data"]
    demo_keys = [k for k in keys if k["name"] == "demo"]
    assert len(demo_keys) == 2  # a fresh demo key each start, the last one revoked
    assert sorted(k["revoked_at"] is None for k in demo_keys) == [False, True]
    demo = [f"demo-{m}" for m in ("dflash", "dspark", "eagle3", "p-eagle", "plain")]
    assert names == sorted([*demo, "qwen-eagle3"])
    assert again.stop(signal.SIGINT, timeout_s=SHUTDOWN_TIMEOUT_S) == 0, again.output()
    assert gateway_log.read_text().count("Application startup complete") == 2  # appended


def test_up_with_a_configured_token_keeps_no_file_and_refuses_a_shared_one(
    start_server: ServerStarter, run_cli: CliRunner, tmp_path: Path
) -> None:
    set_token = "a-configured-token-of-some-length"
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/set.db", DRAFTGATE_ADMIN_TOKEN=set_token
    )
    server = start_server("up", "--sim-base-port", str(free_port_block(5)), "--time-scale", "20",
                          "--no-dashboard", env=env)  # fmt: skip
    assert server.wait_for_output(r"^\s*admin token\s+(\S+)\s").group(1) == set_token
    assert not (tmp_path / ".draftgate" / "admin-token").exists()
    assert server.stop(signal.SIGINT, timeout_s=SHUTDOWN_TIMEOUT_S) == 0, server.output()

    kept = tmp_path / ".draftgate" / "admin-token"
    kept.write_text("x" * 43 + "\n")
    kept.chmod(0o644)
    done = run_cli("up", "--no-dashboard", env=draftgate_env())
    assert done.returncode == 2
    assert "admin-token is readable by others: chmod 600 it, or delete it" in done.stderr


# --- draftgate keys ---------------------------------------------------------------------


def test_keys_create_list_revoke(run_cli: CliRunner, database_url: str) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)

    created = run_cli("keys", "create", "team-a", env=env)
    assert created.returncode == 0, created.stderr
    match = re.search(r"created key (\d+) \(team-a\)", created.stdout)
    assert match, created.stdout
    key_id = match.group(1)
    keys = [w for w in created.stdout.split() if w.startswith("dg-")]
    assert len(keys) == 1, created.stdout
    key = keys[0]
    assert len(key) > 20

    listed = run_cli("keys", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert key[:10] in listed.stdout
    assert "team-a" in listed.stdout
    assert key not in listed.stdout

    revoked = run_cli("keys", "revoke", key_id, env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked key {key_id}" in revoked.stdout
    assert "team-a" not in run_cli("keys", "list", env=env).stdout
    with_revoked = run_cli("keys", "list", "--include-revoked", env=env).stdout
    (row,) = [line for line in with_revoked.splitlines() if "team-a" in line]
    assert not row.rstrip().endswith(" -")  # carries a revocation time

    unknown = run_cli("keys", "revoke", "999999", env=env)
    assert unknown.returncode == 1
    assert "999999" in unknown.stderr


def test_teams_create_list_and_a_key_of_a_team(run_cli: CliRunner, database_url: str) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    made = run_cli("teams", "create", "search", "--weight", "2", "--priority", "-3", env=env)
    assert made.returncode == 0, made.stderr
    match = re.search(r"created team (\d+) \(search\)", made.stdout)
    assert match, made.stdout
    team_id = match.group(1)
    teams = run_cli("teams", "list", env=env).stdout.splitlines()
    (row,) = [line for line in teams if "search" in line]
    assert row.split()[:5] == [team_id, "search", "0", "2", "-3"]
    key = run_cli("keys", "create", "search-app", "--team-id", team_id, env=env)
    assert key.returncode == 0, key.stderr
    keys = run_cli("keys", "list", env=env).stdout.splitlines()
    (row,) = [line for line in keys if "search-app" in line]
    assert row.split()[3] == team_id
    refused = run_cli("teams", "create", "heavy", "--weight", "0", env=env)
    assert refused.returncode != 0


def test_keys_create_opts_out_of_the_lossless_watchdog(
    run_cli: CliRunner, database_url: str
) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    for args in (("checked",), ("private", "--lossless-opt-out")):
        created = run_cli("keys", "create", *args, env=env)
        assert created.returncode == 0, created.stderr
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT name, lossless_opt_out FROM api_keys")).all()
    finally:
        engine.dispose()
    assert sorted(rows) == [("checked", False), ("private", True)]


# --- commands still to come -------------------------------------------------------------


# --- draftgate plan predict -----------------------------------------------------------


def test_plan_predict_contract(run_cli: CliRunner, tmp_path: Path) -> None:
    scenario = EXAMPLE
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    done = run_cli("plan", "predict", "--input", str(path), env=draftgate_env())
    assert done.returncode == 0, done.stderr
    predictions = json.loads(done.stdout)["predictions"]
    assert [p["concurrency"] for p in predictions] == [1, 4, 8, 16, 32]
    keys = {
        "concurrency",
        "plain_output_tokens_per_s",
        "method_output_tokens_per_s",
        "speedup",
        "itl_ms",
        "usd_per_mtok",
        "source",
    }
    assert all(set(p) == keys for p in predictions)
    assert predictions[0]["source"] == "measured"

    path.write_text(json.dumps({**scenario, "k": 0}))
    bad = run_cli("plan", "predict", "--input", str(path), env=draftgate_env())
    assert bad.returncode != 0
    assert bad.stderr.strip().count("\n") == 0  # one line
    assert "got 0" in bad.stderr


def test_plan_table_marks_stored_measurements(run_cli: CliRunner, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path}/plan.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    assert run_cli("db", "upgrade", env=env).returncode == 0
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            Measurement.__table__.insert(),
            [
                {
                    "model": "Qwen/Qwen3-8B",
                    "method": "plain",
                    "k": 0,
                    "gpu_type": "H100",
                    "gpu_count": 1,
                    "concurrency": 4.0,
                    "output_tokens_per_s": 777.0,
                    "source": "bench",
                    "measured_at": dt.datetime.now(dt.UTC),
                }
            ],
        )
    engine.dispose()
    done = run_cli("plan", "table", "--model", "Qwen/Qwen3-8B", "--gpu", "H100", env=env)
    assert done.returncode == 0, done.stderr
    assert "1 measurements" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.split()[:2] == ["plain", "4"])
    assert "777*" in row
    assert sum("*" in line for line in done.stdout.splitlines()) == 1


def test_up_with_demo_traffic_serves_requests_nobody_sent(
    start_server: ServerStarter, tmp_path: Path
) -> None:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/demo.db",
        DRAFTGATE_ACCESS_LOG_INTERVAL_S="1",
    )
    args = ("up", "--sim-base-port", str(free_port_block(5)), "--time-scale", "20",
            "--no-dashboard", "--demo-traffic")  # fmt: skip
    server = start_server(*args, env=env, wait=False)
    server.wait_healthy(60.0)
    assert "demo traffic on" in server.output()
    token = server.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1)
    demo_key = server.wait_for_output(r"^\s*demo API key\s+(\S+)\s").group(1)
    deadline = time.monotonic() + 30
    while metric_value(server.base_url, "draftgate_requests_total", status="2xx") < 5:
        assert time.monotonic() < deadline, server.output()[-2000:]
        time.sleep(0.5)
    assert metric_value(server.base_url, "draftgate_requests_total", status="4xx") == 0
    with server.client(token) as admin:  # the traffic is the printed demo key's
        keys = admin.get("/admin/v1/keys").json()["data"]
        demo = next(k for k in keys if k["name"] == "demo")
        assert demo_key.startswith(demo["key_prefix"])
        deadline, by_key = time.monotonic() + 30, {"group_by": "key"}
        while not (rows := admin.get("/admin/v1/savings", params=by_key).json()["data"]):
            assert time.monotonic() < deadline, "no usage rolled up"
            time.sleep(0.5)
        assert {r["key"] for r in rows} == {demo["id"]}
    # The logs say what happened: the gateway's its choice and its traffic, each backend's
    # its engine's figures, as vLLM prints them.
    logs = tmp_path / ".draftgate" / "logs"
    _wait_for_line(logs, "gateway.log", r"auto: openai/gpt-oss-20b first choice plain -> \S+")
    _wait_for_line(logs, "gateway.log", r"access: \d+ requests in \d+ s \(ok \d+")
    _wait_for_line(logs, "demo-plain.log", r"simulated vLLM \S+ serving openai/gpt-oss-20b")
    _wait_for_line(logs, "demo-*.log", r"Engine 000: Avg prompt throughput: [\d.]+ tokens/s")
    _wait_for_line(logs, "demo-*.log", r"SpecDecoding metrics: Mean acceptance length: ")
    assert server.stop(signal.SIGINT, timeout_s=SHUTDOWN_TIMEOUT_S) == 0, server.output()


def _wait_for_line(logs: Path, name: str, pattern: str, timeout_s: float = 60.0) -> None:
    """Until a line of a log named `name` (a glob) matches `pattern` (a backend logs its
    figures every 10 s)."""
    deadline = time.monotonic() + timeout_s
    while not any(re.search(pattern, p.read_text(encoding="utf-8")) for p in logs.glob(name)):
        assert time.monotonic() < deadline, f"{name}: no {pattern!r} in {timeout_s} s"
        time.sleep(0.5)


def test_a_command_whose_extra_is_missing_names_what_to_install(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    # An interpreter without the tiny-models extra: its modules fail to import, as uninstalled.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nfor name in ('numpy', 'safetensors', 'tokenizers'):\n"
        "    sys.modules[name] = None  # import raises ModuleNotFoundError\n"
    )
    done = run_cli(
        "dev", "tiny-models", str(tmp_path / "models"), env=draftgate_env(PYTHONPATH=str(site))
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "draftgate: this command needs the tiny-models extra (numpy is not installed): "
        "pip install 'draftgate[tiny-models]'"
    ]
    assert not (tmp_path / "models").exists()
