"""Locally managed backends: start a server process, wait for health, stop it, explain failures.

Used by `draftgate up` for its simulated backends; a real `vllm serve` fits the same
interface (an argv and a port), which the managed-backends work builds on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 20


class LaunchError(RuntimeError):
    """A managed server did not come up; the message carries its last log lines."""


def sim_argv(
    model: str, method: str, port: int, *, gpu: str = "B200", time_scale: float = 1.0
) -> list[str]:
    """The command line of one simulated vLLM server."""
    draftgate = Path(sys.executable).parent / "draftgate"
    return [str(draftgate), "sim", "--model", model, "--method", method, "--gpu", gpu,
            "--port", str(port), "--time-scale", str(time_scale)]  # fmt: skip


@dataclass
class LocalServer:
    """One server process this draftgate started and owns."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process, its output going to `log_path`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(  # noqa: S603  (our own argv, no shell)
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until `GET /health` answers 200; LaunchError if it dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise LaunchError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise LaunchError(f"{self.name} not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self) -> str:
        """The last lines the server wrote."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])
