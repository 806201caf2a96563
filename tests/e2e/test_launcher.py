"""LocalServer on real processes and sockets: start, health, stop, and why a start failed."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from backends.launcher import LaunchError, LocalServer, listening_pids, sim_argv
from tests.e2e.conftest import SIM_MODEL, free_port


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign_health_server() -> Iterator[int]:
    """Something else (this test process) answering GET /health on a port; the port."""
    http = ThreadingHTTPServer(("127.0.0.1", free_port()), _Health)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield http.server_address[1]
    finally:
        http.shutdown()
        http.server_close()


def test_a_simulator_starts_answers_and_stops(tmp_path: Path) -> None:
    port = free_port()
    server = LocalServer("sim", sim_argv(SIM_MODEL, "plain", port), port, tmp_path / "sim.log")
    server.start()
    try:
        server.wait_healthy(30)
        assert server.process is not None
        assert server.process.pid in (listening_pids(port) or {server.process.pid})
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_a_server_that_dies_reports_its_last_log_lines(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(30): print(f'line {i}')\nprint('fatal: bad model')\n"
    port = free_port()
    server = LocalServer("dying", _python(code + "sys.exit(3)"), port, tmp_path / "d.log")
    server.start()
    with pytest.raises(LaunchError, match="dying exited during start-up") as failure:
        server.wait_healthy(30)
    assert "fatal: bad model" in str(failure.value)
    assert "line 29" in str(failure.value)
    assert "line 5\n" not in str(failure.value)  # only the tail
    server.stop()


def test_a_server_that_never_answers_times_out_with_its_log(tmp_path: Path) -> None:
    port = free_port()
    code = "import time\nprint('loading weights', flush=True)\ntime.sleep(60)"
    server = LocalServer("slow", _python(code), port, tmp_path / "s.log")
    server.start()
    try:
        with pytest.raises(LaunchError, match=r"slow not healthy after 2 s:\nloading weights"):
            server.wait_healthy(2)
    finally:
        server.stop()


def test_a_busy_port_is_refused_before_starting(foreign_health_server: int, tmp_path: Path) -> None:
    server = LocalServer("late", _python("pass"), foreign_health_server, tmp_path / "l.log")
    with pytest.raises(LaunchError, match=f"port {foreign_health_server} is already in use"):
        server.start()
    assert server.process is None


def test_health_answered_by_another_process_is_not_ours(tmp_path: Path) -> None:
    port = free_port()
    server = LocalServer("quiet", _python("import time; time.sleep(60)"), port, tmp_path / "q.log")
    server.start()
    # Something else takes the port after our process started but before it listens.
    http = ThreadingHTTPServer(("127.0.0.1", port), _Health)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(LaunchError, match="answered by another process"):
            server.wait_healthy(10)
    finally:
        http.shutdown()
        http.server_close()
        server.stop()
