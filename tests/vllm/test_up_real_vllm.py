"""`draftgate up --real-vllm`: a real vLLM backend, managed, switched to another method under
load with no failed request; the new server's own counters show it speculating."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from backends.vllm_metrics import parse_metrics
from tests.e2e.conftest import ServerStarter, draftgate_env, free_port_block, start_server

__all__ = ["start_server"]  # the e2e fixture, used here
pytestmark = pytest.mark.vllm

START_TIMEOUT_S = 480.0
SWITCH_TIMEOUT_S = START_TIMEOUT_S + 60.0  # start, then drain
MODEL = "tiny-llama"
GREEDY = {"temperature": 0, "ignore_eos": True}


def _stream(http: httpx.Client) -> str | None:
    """One streamed completion; None if it succeeded, else what went wrong."""
    body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 16, "stream": True, **GREEDY}
    try:
        with http.stream("POST", "/v1/completions", json=body) as response:
            text = "".join(response.iter_text())
    except httpx.HTTPError as exc:
        return repr(exc)
    done = response.status_code == 200 and text.rstrip().endswith("data: [DONE]")
    return None if done else f"{response.status_code}: {text[-300:]}"


def test_up_serves_real_vllm_and_switches_it_with_no_failed_request(
    vllm_python: Path, start_server: ServerStarter, tmp_path: Path
) -> None:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/real.db",
        DRAFTGATE_VLLM_PYTHON=str(vllm_python),
        DRAFTGATE_MANAGED_START_TIMEOUT_S=str(START_TIMEOUT_S),
    )
    args = ("up", "--real-vllm", "--methods", "ngram", "--sim-base-port",
            str(free_port_block(1)), "--no-dashboard")  # fmt: skip
    server = start_server(*args, env=env, wait=False)
    server.wait_healthy(START_TIMEOUT_S)
    token = server.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1)
    with openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as llm:
        chat = llm.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            extra_body=GREEDY,
        )
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 8

    target = tmp_path / ".draftgate" / "models" / "tiny-llama"
    switch = {"method": "draft_model", "k": 3, "drafter": str(target)}
    stop, failures = threading.Event(), []
    with server.client(token) as admin, ThreadPoolExecutor(1) as pool:

        def load() -> int:
            sent = 0
            with httpx.Client(base_url=server.base_url, timeout=120) as http:
                while not stop.is_set():
                    problem = _stream(http)
                    sent += 1
                    if problem:
                        failures.append(problem)
            return sent

        sent = pool.submit(load)
        try:
            accepted = admin.post("/admin/v1/backends/real-ngram/switch", json=switch)
            assert accepted.status_code == 202, accepted.text
            deadline = time.monotonic() + SWITCH_TIMEOUT_S
            while admin.get("/admin/v1/backends/real-ngram").status_code != 404:
                assert time.monotonic() < deadline, server.output()[-3000:]
                time.sleep(1.0)
        finally:
            stop.set()
        assert sent.result() > 0
        assert not failures, failures[:3]
        new = admin.get("/admin/v1/backends/real-draft_model-k3").json()
        assert (new["method"], new["managed"], new["enabled"]) == ("draft_model", True, True)

    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        assert _stream(http) is None
    page = parse_metrics(httpx.get(f"{new['url']}/metrics", timeout=10).text)
    assert page.drafts is not None
    assert page.drafts > 0
    assert page.accepted_tokens is not None
    assert 1 + page.accepted_tokens / page.drafts > 2.0  # the target drafting for itself
