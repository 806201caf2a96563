"""The simulator's fault switches end to end: real `draftgate sim` processes on real sockets."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import SIM_MODEL, Server, ServerStarter, draftgate_env, sim_args

FAST = ("--method", "p-eagle", "--k", "7", "--time-scale", "20")
STREAM = {
    "model": SIM_MODEL,
    "messages": [{"role": "user", "content": "Stream please."}],
    "max_tokens": 100,
    "ignore_eos": True,
    "stream": True,
}
DONE = "data: [DONE]"
# A client read timeout that only a stall trips: a busy machine may pause a healthy stream
# for a second, never for this long.
STALL_READ_TIMEOUT_S = 3.0
SETTLE_TIMEOUT_S = 20.0  # deadline of polls and of a graceful exit, for a busy machine


def start_sim(start_server: ServerStarter, *faults: str, wait: bool = True) -> Server:
    """A fast p-eagle server with the given fault switches."""
    return start_server(*sim_args(*FAST, *faults), env=draftgate_env(), wait=wait)


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    """A short raw chat request."""
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": content}]}
    return {**body, "max_tokens": 8, **extra}


def set_faults(http: httpx.Client, **switches: float) -> None:
    """Change fault switches at run time through POST /sim/faults."""
    response = http.post("/sim/faults", json=switches)
    assert response.status_code == 200, response.text
    assert response.json().items() >= switches.items()


def read_stream(http: httpx.Client, body: dict[str, Any], lines: list[str]) -> None:
    """POST a streaming chat request and collect its SSE lines into `lines` as they come."""
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line:
                lines.append(line)


def assert_streams_completely(http: httpx.Client) -> None:
    """A streaming request runs to `data: [DONE]`."""
    lines: list[str] = []
    read_stream(http, STREAM, lines)
    assert lines[-1] == DONE


def gauge(http: httpx.Client, name: str) -> float:
    """The value of the one sample called `name` in GET /metrics."""
    families = text_string_to_metric_families(http.get("/metrics").text)
    values = [s.value for f in families for s in f.samples if s.name == name]
    assert len(values) == 1
    return values[0]


def counter(http: httpx.Client, name: str, **labels: str) -> float:
    """The sum of the samples called `name` that carry `labels`."""
    families = text_string_to_metric_families(http.get("/metrics").text)
    samples = [s for f in families for s in f.samples if s.name == name]
    return sum(s.value for s in samples if labels.items() <= s.labels.items())


def wait_until_idle(http: httpx.Client) -> None:
    """Poll until the engine runs and queues nothing (a leaked request would stay)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        running = gauge(http, "vllm:num_requests_running")
        if running == 0 and gauge(http, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.05)
    pytest.fail(f"requests still running after {SETTLE_TIMEOUT_S} s")


def test_error_rate_answers_500_in_vllm_shape(start_server: ServerStarter) -> None:
    server = start_sim(start_server, "--error-rate", "1")
    with server.client() as http:
        requests = [
            ("/v1/chat/completions", chat()),
            ("/v1/chat/completions", chat(stream=True)),
            ("/v1/completions", {"model": SIM_MODEL, "prompt": "hi", "max_tokens": 4}),
        ]
        for path, body in requests:
            response = http.post(path, json=body)
            assert response.status_code == 500, response.text
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("InternalServerError", 500)
            assert error["message"]
            assert http.get("/health").status_code == 200
        with (
            openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as llm,
            pytest.raises(openai.InternalServerError),
        ):
            llm.chat.completions.create(**chat())
        for bad in ({"no_such_switch": 1}, {"error_rate": "abc"}, {"error_rate": 2}):
            refused = http.post("/sim/faults", json=bad)
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["type"] == "BadRequestError"
        set_faults(http, error_rate=0)
        response = http.post("/v1/chat/completions", json=chat())
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]


def test_drop_rate_cuts_streams(start_server: ServerStarter) -> None:
    server = start_sim(start_server, "--drop-rate", "1")
    with server.client() as http:
        lines: list[str] = []
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            read_stream(http, STREAM, lines)  # the connection is cut mid-body
        assert any('"content"' in line for line in lines)  # cut mid-stream, not before
        assert DONE not in lines
        set_faults(http, drop_rate=0)
        assert_streams_completely(http)
        wait_until_idle(http)


def test_stall_rate_stalls_without_leaking(start_server: ServerStarter) -> None:
    server = start_sim(start_server, "--stall-rate", "1")
    timeout = httpx.Timeout(10.0, read=STALL_READ_TIMEOUT_S)
    with httpx.Client(base_url=server.base_url, timeout=timeout) as http:
        lines: list[str] = []
        with pytest.raises(httpx.ReadTimeout):
            read_stream(http, STREAM, lines)
        assert any('"content"' in line for line in lines)  # some chunks, then silence
        assert DONE not in lines
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=chat())
        set_faults(http, stall_rate=0)
        assert_streams_completely(http)
        wait_until_idle(http)
        assert counter(http, "vllm:request_success_total", finished_reason="abort") == 2
    # A handler still stuck on a stalled request would hold up uvicorn's graceful shutdown.
    assert server.stop(signal.SIGTERM, timeout_s=SETTLE_TIMEOUT_S) == 0


def test_crash_after_s_exits_nonzero(start_server: ServerStarter) -> None:
    server = start_sim(start_server, "--crash-after-s", "1")
    healthy = time.monotonic()
    code = server.process.wait(timeout=10.0)
    assert code != 0
    assert time.monotonic() - healthy < 5.0
    assert "crash_after_s" in server.output()


def test_startup_delay_s_holds_back_health(start_server: ServerStarter) -> None:
    launched = time.monotonic()
    server = start_sim(start_server, "--startup-delay-s", "2", wait=False)
    with httpx.Client(base_url=server.base_url, timeout=1.0) as http:
        while time.monotonic() - launched < 1.5:
            with pytest.raises(httpx.ConnectError):
                http.get("/health")
            time.sleep(0.1)
        server.wait_healthy()
        assert time.monotonic() - launched >= 2.0
        assert http.post("/v1/chat/completions", json=chat()).status_code == 200


def test_diverge_rate_leaves_the_targets_tokens_at_the_given_token(
    start_server: ServerStarter,
) -> None:
    """A clean answer is the same every time (the target's, greedy); with the switch on,
    the answer keeps its first `diverge_at` tokens and differs from there (a lossy verify
    path, for the lossless watchdog's tests); off again, the target's once more."""
    server = start_sim(start_server)
    body = chat("the same question", max_tokens=16, ignore_eos=True, temperature=0)
    with server.client() as http:

        def words() -> list[str]:
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            content: str = response.json()["choices"][0]["message"]["content"]
            return content.split()

        clean = words()
        assert words() == clean
        set_faults(http, diverge_rate=1, diverge_at=5)
        lossy = words()
        assert len(lossy) == len(clean) == 16
        assert lossy[:5] == clean[:5]
        assert lossy[5:] != clean[5:]
        set_faults(http, diverge_rate=0)
        assert words() == clean
