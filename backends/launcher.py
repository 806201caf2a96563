"""Locally managed backends: start a server process, wait for health, stop it, explain failures.

Used by `draftgate up` for its simulated backends and for real `vllm serve` processes: both
are an argv, an environment and a port. `vllm_argv` renders a vLLM server's command line
from the method catalog; `vllm_env` is the environment it needs to serve offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from backends.methods import MethodSpec, render_speculative_config, render_vllm_args

STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 20
HEALTH_POLL_S = 0.1
LOCALHOST = "127.0.0.1"

# What a small model needs to serve on a CPU-only host: no torch.compile warm-up (it
# doubles start-up), a fixed KV cache (the default sizes it from a fraction of all RAM),
# a short context and full precision.
CPU_SERVE_ARGS = ("--enforce-eager", "--kv-cache-memory-bytes", "64M",
                  "--max-model-len", "512", "--dtype", "float32")  # fmt: skip
PER_REQUEST_SPEC_ARGS = ("--per-request-spec-decode-metrics", "summary")
# Local paths only, never the hub; no usage reports.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class LaunchError(RuntimeError):
    """A managed server did not come up; the message carries its last log lines."""


def sim_argv(
    model: str, method: str, port: int, *, gpu: str = "B200", time_scale: float = 1.0
) -> list[str]:
    """The command line of one simulated vLLM server (reporting each request's drafts and
    accepts, as `vllm_argv`'s servers do)."""
    draftgate = Path(sys.executable).parent / "draftgate"
    return [str(draftgate), "sim", "--model", model, "--method", method, "--gpu", gpu,
            "--port", str(port), "--time-scale", str(time_scale),
            "--per-request-spec-metrics"]  # fmt: skip


def vllm_argv(
    model: str,
    spec: MethodSpec,
    port: int,
    *,
    vllm_python: Path | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = CPU_SERVE_ARGS,
    scheduling: str = "fcfs",
) -> list[str]:
    """`vllm serve` for `model` decoding with `spec` on 127.0.0.1:`port`.

    The `vllm` command is the one beside `vllm_python` (vLLM's own virtualenv), else the
    one on PATH. `extra_args` defaults to what a CPU-only host needs. A speculative server
    reports each request's own drafts and accepts in its answer (vLLM's
    `--per-request-spec-decode-metrics summary`), which the gateway records per request.
    """
    if render_speculative_config(spec) is not None:
        extra_args = (*extra_args, *PER_REQUEST_SPEC_ARGS)
    argv = render_vllm_args(
        model,
        spec,
        port=port,
        host=LOCALHOST,
        served_model_name=served_model_name,
        extra_args=extra_args,
        scheduling=scheduling,
    )
    if vllm_python is not None:
        argv[0] = str(vllm_python.parent / "vllm")
    return argv


def vllm_env(vllm_python: Path | None = None) -> dict[str, str]:
    """Variables a `vllm serve` process needs on top of the inherited environment.

    vLLM's CPU build drafts much faster with Intel's OpenMP preloaded; its virtualenv
    ships the library (the `intel-openmp` dependency). Its automatic thread binding pins
    every server on a host to the same core, so a server starting beside a busy one
    starves (seen: no progress in five minutes); several local servers need `nobind`.
    """
    env = dict(OFFLINE_ENV) | {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    if vllm_python is not None:
        iomp = vllm_python.parent.parent / "lib" / "libiomp5.so"
        if iomp.is_file():
            env["LD_PRELOAD"] = str(iomp)
    return env


@dataclass
class LocalServer:
    """One server process this draftgate started and owns."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)  # added to the inherited environment
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process, its output going to `log_path`; LaunchError if the port is
        taken (another server would answer our health checks)."""
        if _accepts_connections(self.port):
            raise LaunchError(f"{self.name}: port {self.port} is already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        # The child inherits this process's environment plus its own variables.
        env = {**os.environ, **self.env} if self.env else None
        self.process = subprocess.Popen(  # noqa: S603  (our own argv, no shell)
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until `GET /health` answers 200; LaunchError if it dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._raise_if_exited()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    self._check_listener()
                    return
            time.sleep(HEALTH_POLL_S)
        raise self._not_healthy(timeout_s)

    async def wait_healthy_async(self, timeout_s: float) -> None:
        """`wait_healthy` for an event loop: cancellable, and it blocks nothing meanwhile."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                self._raise_if_exited()
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        self._check_listener()
                        return
                await asyncio.sleep(HEALTH_POLL_S)
        raise self._not_healthy(timeout_s)

    def _raise_if_exited(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise LaunchError(f"{self.name} exited during start-up:\n{self.log_tail()}")

    def _not_healthy(self, timeout_s: float) -> LaunchError:
        return LaunchError(f"{self.name} not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def _check_listener(self) -> None:
        """LaunchError unless the socket answering on our port belongs to our process group."""
        assert self.process is not None
        owners = listening_pids(self.port)
        if owners and not owners & session_pids(self.process.pid):
            raise LaunchError(
                f"{self.name}: port {self.port} is answered by another process "
                f"(pids {sorted(owners)}), not the one started"
            )

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


def _accepts_connections(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((LOCALHOST, port), timeout=0.5):
        return True
    return False


PROC = Path("/proc")
TCP_LISTEN = "0A"


def listening_pids(port: int) -> set[int] | None:
    """Processes holding a socket that listens on `port`; None (or empty) where /proc
    cannot tell."""
    try:
        table = (PROC / "net" / "tcp").read_text() + (PROC / "net" / "tcp6").read_text()
    except OSError:
        return None
    inodes = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[3] == TCP_LISTEN and fields[1].endswith(f":{port:04X}"):
            inodes.add(f"socket:[{fields[9]}]")
    return {pid for pid in _all_pids() if _holds_any(pid, inodes)}


def session_pids(session_id: int) -> set[int]:
    """Processes of the session `session_id` leads (a started server and its children)."""
    pids = set()
    for pid in _all_pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (PROC / str(pid) / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[3]) == session_id:
                pids.add(pid)
    return pids


def _all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def _holds_any(pid: int, inodes: set[str]) -> bool:
    with contextlib.suppress(OSError):
        for fd in (PROC / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False
