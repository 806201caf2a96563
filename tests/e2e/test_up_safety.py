"""`draftgate up` (what `make up` runs) on a machine where one may already run: a second start
in the same directory, or on a port another program holds, exits before it touches any state;
key enforcement is taken from the environment and said in the banner."""

from __future__ import annotations

import signal
import socket
import stat
from pathlib import Path

from tests.e2e.conftest import (
    CliRunner,
    ServerStarter,
    draftgate_env,
    free_port,
    free_port_block,
)

MODEL = "openai/gpt-oss-20b"
SHUTDOWN_TIMEOUT_S = 60.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _up_args(*extra: str) -> tuple[str, ...]:
    return ("up", "--sim-base-port", str(free_port_block(5)), "--time-scale", "20",
            "--no-dashboard", *extra)  # fmt: skip


def test_a_second_up_says_where_the_first_runs_and_changes_nothing(
    start_server: ServerStarter, run_cli: CliRunner, tmp_path: Path
) -> None:
    env = draftgate_env(DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/up.db")
    first = start_server(*_up_args(), env=env)
    token = first.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1)
    demo_key = first.wait_for_output(r"^\s*demo API key\s+(\S+)\s").group(1)
    with first.client(token) as admin:
        keys_before = admin.get("/admin/v1/keys").json()["data"]
    state = tmp_path / ".draftgate"  # this user's alone: what is in it steers the stack
    assert _mode(state) == 0o700
    assert {name: _mode(state / name) for name in ("up.lock", "admin-token")} == {
        "up.lock": 0o600, "admin-token": 0o600,
    }  # fmt: skip
    assert _mode(tmp_path / "up.db") == 0o600  # usage, key hashes, backend keys

    # Other ports, the same directory (and so the same database and state).
    second = run_cli(*_up_args("--port", str(free_port())), env=env)

    assert second.returncode == 2, second.stdout + second.stderr
    assert f"already running at {first.base_url} (pid {first.process.pid})" in second.stderr
    assert "draftgate is starting" not in second.stdout  # it started nothing
    with first.client(token) as admin:
        assert admin.get("/admin/v1/keys").json()["data"] == keys_before  # no key revoked
        keys = {k["name"]: k for k in keys_before}
        assert demo_key.startswith(keys["demo"]["key_prefix"])
    with first.client(demo_key) as client:  # the running demo's key still serves, as itself
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert first.stop(signal.SIGINT, timeout_s=SHUTDOWN_TIMEOUT_S) == 0, first.output()

    # Once the first has stopped, the directory is free again.
    again = start_server(*_up_args(), env=env)
    assert again.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1) == token


def test_up_on_a_port_in_use_names_it_before_touching_any_state(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    database = tmp_path / "taken.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=f"sqlite:///{database}")
    with socket.socket() as holder:  # another program on the gateway's port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_cli(*_up_args("--port", str(port)), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {port} in use by another program" in done.stderr
    assert "PORT=" in done.stderr  # and how to choose another
    assert not database.exists()  # no database made, no key issued
    assert not (tmp_path / ".draftgate" / "admin-token").exists()


def test_up_requires_api_keys_when_told_to_and_says_so(
    start_server: ServerStarter, tmp_path: Path
) -> None:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/keys.db", DRAFTGATE_REQUIRE_API_KEY="true"
    )
    server = start_server(*_up_args(), env=env)
    demo_key = server.wait_for_output(r"^\s*demo API key\s+(\S+)\s").group(1)
    assert "an API key is required" in server.output()
    with server.client() as anonymous:
        refused = anonymous.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "invalid_api_key"
    with server.client(demo_key) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_up_in_a_state_directory_others_may_write_refuses_it(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / ".draftgate").mkdir()
    (tmp_path / ".draftgate").chmod(0o777)
    env = draftgate_env(DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/up.db")
    refused = run_cli(*_up_args(), env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ".draftgate may be written by others (mode 777): chmod 700 it" in refused.stderr
    assert not (tmp_path / "up.db").exists()
    assert list((tmp_path / ".draftgate").iterdir()) == []
