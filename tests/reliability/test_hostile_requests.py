"""Hostile `/v1` requests against a real gateway process on a real socket.

Each gets a clean 4xx with the OpenAI envelope or a closed connection, never a 5xx; a good
request between every two bad ones is served, and the ledger holds a record of each good one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import (
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    sim_args,
    start_module_gateway,  # noqa: F401  (a fixture, found by its import here)
    wait_for_usage_records,
)

MAX_BODY_BYTES = 65_536
READ_TIMEOUT_S = 2.0
MAX_HEADER_BYTES = 16_384
CLOSE_WITHIN_S = 30.0  # generous: the server closes after its timeout, on a busy machine too
CHAT = [{"role": "user", "content": "Hello there."}]
GOOD = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 3}
ENVELOPE_KEYS = {"message", "type", "param", "code"}
CLOSED = "closed"
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
)


@dataclass
class Tally:
    """What the table reports per scenario."""

    sent: int = 0
    refused: int = 0  # a 4xx with the envelope, or the connection closed
    server_errors: int = 0
    good_ids: list[str] = field(default_factory=list)


@dataclass
class Target:
    """The module's gateway in front of one simulator."""

    gateway: Server
    database_url: str
    tallies: dict[str, Tally] = field(default_factory=dict)

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.gateway.port)


@pytest.fixture(scope="module")
def target(
    start_module_servers: ModuleServerStarter,
    start_module_gateway: ModuleGatewayStarter,  # noqa: F811  (the fixture imported above)
) -> Iterator[Target]:
    (sim,) = start_module_servers(sim_args("--time-scale", "50"))
    gateway, database_url = start_module_gateway(
        [fleet_backend("sim", sim.base_url)],
        MAX_BODY_BYTES=str(MAX_BODY_BYTES),
        REQUEST_READ_TIMEOUT_S=str(READ_TIMEOUT_S),
        MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
        LOG_LEVEL="warning",
    )
    found = Target(gateway, database_url)
    yield found
    ids = [i for t in found.tallies.values() for i in t.good_ids]
    wait_for_usage_records(database_url, ids, timeout_s=30.0)  # none lost
    assert gateway.process.poll() is None
    assert "Traceback" not in gateway.output()
    print_table(found.tallies)


def print_table(tallies: dict[str, Tally]) -> None:
    """The figures for RELIABILITY.md (shown with `pytest -s`)."""
    print(
        "\n| scenario | bad requests | 4xx/closed | 5xx | good between | crashes | records lost |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        good = len(t.good_ids)
        print(f"| {name} | {t.sent} | {t.refused} | {t.server_errors} | {good} | 0 | 0 |")


# --- Sending: httpx for well-formed HTTP, plain sockets for the rest. ---


def post(target: Target, content: bytes, **headers: str) -> httpx.Response:
    with httpx.Client(base_url=target.gateway.base_url, timeout=30.0) as http:
        headers.setdefault("content-type", "application/json")
        return http.post("/v1/chat/completions", content=content, headers=headers)


def raw(target: Target, data: bytes, read_timeout_s: float = CLOSE_WITHIN_S) -> bytes | str:
    """Send raw bytes; the response bytes, or CLOSED when the server closed without one."""
    with socket.create_connection(target.address, timeout=read_timeout_s) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)  # the server may stop reading: what it answered is still readable
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes | str:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks) or CLOSED


def status_of(answer: bytes | str) -> int | str:
    if answer == CLOSED:
        return CLOSED
    assert isinstance(answer, bytes)
    return int(answer.split(b" ", 2)[1])


def good_request(target: Target, tally: Tally) -> None:
    """A well-formed request between bad ones: it must succeed (and be recorded)."""
    request_id = f"good-{uuid.uuid4().hex[:16]}"
    response = post(target, orjson.dumps(GOOD), **{"x-request-id": request_id})
    assert response.status_code == 200, response.text
    tally.good_ids.append(request_id)
    assert httpx.get(f"{target.gateway.base_url}/health", timeout=10.0).status_code == 200


def expect_refused(tally: Tally, result: httpx.Response | bytes | str) -> None:
    """A 4xx carrying the OpenAI envelope, or a connection the server closed."""
    tally.sent += 1
    if isinstance(result, httpx.Response):
        status, body = result.status_code, result.content
    else:
        status = status_of(result)
        body = b"" if status == CLOSED else result.partition(b"\r\n\r\n")[2]  # type: ignore[union-attr]
    if isinstance(status, int) and status >= 500:
        tally.server_errors += 1
    assert status == CLOSED or 400 <= status < 500, (status, body[:300])  # type: ignore[operator]
    if status != CLOSED and body:
        error = orjson.loads(body)["error"]
        assert set(error) == ENVELOPE_KEYS, error
    tally.refused += 1


def run_scenario(target: Target, name: str, bad: list[Callable[[], httpx.Response | bytes | str]]):  # type: ignore[no-untyped-def]
    tally = target.tallies.setdefault(name, Tally())
    for send in bad:
        expect_refused(tally, send())
        good_request(target, tally)


# --- The table. ---


def body(**fields: object) -> bytes:
    return orjson.dumps({**GOOD, **fields})


WRONG_TYPES = {
    "model": [123, None, [], {}, True, ""],
    "messages": ["hi", {}, [], None, 5, [None]],
    "stream": ["yes", 1, [], {}],
    "max_tokens": [-1, 0, "10", 1.5, True, [], 2**63 - 1],
    "n": [0, -1, "2", 1.5, False],
    "temperature": ["hot", -1, [], {}, True],
    "top_p": [-0.5, 1.5, "1"],
}


@pytest.mark.parametrize("name", WRONG_TYPES)
def test_wrong_json_types_are_400(target: Target, name: str) -> None:
    bad = [lambda v=v: post(target, body(**{name: v})) for v in WRONG_TYPES[name]]
    run_scenario(target, f"wrong type or value: {name}", bad)


def test_numbers_beyond_64_bits_and_malformed_json_are_400(target: Target) -> None:
    nested = b'{"model":"m","messages":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    cases = [
        b'{"model": "m", "max_tokens": 100000000000000000000000000000}',
        nested,
        b'{"model": "\xff\xfe", "messages": []}',
        b'{"model": "'
        + SIM_MODEL.encode()
        + b'", "messages": [{"role":"user","content":"\xc3("}]}',
        b"",
        b"[]",
        b'"model"',
        b"{",
        b"\x00" * 100,
    ]
    run_scenario(
        target,
        "malformed JSON, deep nesting, invalid UTF-8",
        [lambda c=c: post(target, c) for c in cases],
    )


def test_a_non_json_content_type_is_415(target: Target) -> None:
    response = post(target, body(), **{"content-type": "text/plain"})
    assert response.status_code == 415
    run_scenario(target, "wrong content type", [lambda: response])


def test_keyless_a_body_without_content_type_is_415(target: Target) -> None:
    """A page on another site can post a body with no type (or a form's) without a CORS
    preflight; with no key asked for, only a declared JSON body is served."""
    with httpx.Client(base_url=target.gateway.base_url, timeout=30.0) as http:
        response = http.post("/v1/chat/completions", content=body())
    assert response.request.headers.get("content-type") is None
    assert response.status_code == 415, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    run_scenario(target, "keyless: no content type", [lambda: response])


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("attacker.example", 403),  # a rebound name: the browser sends the page's host
        ("localhost.attacker.example", 403),
        ("127.0.0.1.nip.example", 403),
        ("", 403),
        ("localhost", 200),
        ("LOCALHOST:8080", 200),
        ("[::1]:8080", 200),
    ],
)
def test_keyless_only_listed_hosts_are_served(target: Target, host: str, status: int) -> None:
    response = post(target, body(), host=host)
    assert response.status_code == status, response.text
    if status == 403:
        assert response.json()["error"]["code"] == "host_not_allowed"
        run_scenario(target, "keyless: foreign Host", [lambda: response])


def test_a_huge_body_is_413_without_being_read(target: Target) -> None:
    declared = 1_000_000_000  # 1 GB announced; a few KB actually sent
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared
    )

    def announced() -> bytes | str:
        with socket.create_connection(target.address, timeout=CLOSE_WITHIN_S) as sock:
            sock.sendall(head + b"{" + b" " * 4096)
            answer = read_all(sock)  # returns only once the server closed the connection
        assert status_of(answer) == 413
        assert b"\r\nconnection: close\r\n" in answer.lower()  # type: ignore[union-attr]
        return answer

    def chunked() -> bytes | str:
        chunk = b"%x\r\n%s\r\n" % (8192, b" " * 8192)
        data = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * (MAX_BODY_BYTES // 8192 + 4)
        answer = raw(target, data)
        assert status_of(answer) == 413
        assert b"\r\nconnection: close\r\n" in answer.lower()  # type: ignore[union-attr]
        return answer

    def streamed() -> httpx.Response:
        response = post(target, b"{" + b" " * (MAX_BODY_BYTES + 1) + b"}")
        assert response.status_code == 413
        assert response.headers["connection"] == "close"
        return response

    run_scenario(target, "huge body (> max_body_bytes)", [announced, chunked, streamed])


def test_header_injection_is_refused_or_neutralised(target: Target) -> None:
    payload = body()

    def request(header_lines: bytes) -> bytes | str:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
        )
        answer = raw(
            target, head + header_lines + b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
        if isinstance(answer, bytes):
            head_part = answer.partition(b"\r\n\r\n")[0].lower()
            assert b"set-cookie" not in head_part
            assert b"injected" not in head_part
        return answer

    injections = [
        b"X-Request-Id: abc\rSet-Cookie: injected=1\r\n",
        b"X-Request-Id: abc\nSet-Cookie: injected=1\r\n",
        b"X-Request-Id: abc\x00injected\r\n",
        b"X-Request-Id: abc\r\n Set-Cookie: injected=1\r\n",  # obsolete line folding
        b"Bad Header Name: injected\r\n",
    ]
    run_scenario(
        target,
        "header injection (CR/LF/NUL in headers)",
        [lambda i=i: request(i) for i in injections],
    )


def test_too_many_or_too_large_headers_are_refused(target: Target) -> None:
    payload = body()

    def request(header_lines: bytes) -> bytes | str:
        head = HEAD
        return raw(
            target, head + header_lines + b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )

    many = b"".join(b"X-Filler-%d: v\r\n" % i for i in range(5000))
    large = b"X-Large: " + b"a" * (MAX_HEADER_BYTES * 4) + b"\r\n"
    huge = b"X-Huge: " + b"a" * 4_000_000 + b"\r\n"
    run_scenario(
        target,
        "too many / too large headers",
        [lambda h=h: request(h) for h in (many, large, huge)],
    )


def test_slowloris_is_cut_off_while_others_are_served(target: Target) -> None:
    payload = body()
    padding = b"X-Padding: " + b"p" * 400 + b"\r\n"
    head = HEAD + padding + b"Content-Length: %d\r\n\r\n" % len(payload)
    results: dict[str, tuple[bytes | str, int]] = {}

    def slow(name: str, data: bytes, prefix: bytes = b"") -> None:
        with socket.create_connection(target.address, timeout=CLOSE_WITHIN_S) as sock:
            sock.sendall(prefix)
            sent, deadline = 0, time.monotonic() + CLOSE_WITHIN_S
            try:
                for byte in data:
                    sock.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.25)
                    if time.monotonic() > deadline:
                        break
            except (BrokenPipeError, ConnectionResetError):
                pass
            results[name] = (read_all(sock), sent)

    def idle() -> None:
        with socket.create_connection(target.address, timeout=CLOSE_WITHIN_S) as sock:
            results["idle"] = (read_all(sock), 0)

    threads = [
        threading.Thread(target=slow, args=("headers", head + payload)),
        threading.Thread(target=slow, args=("body", payload + b" " * 1000, head)),
        threading.Thread(target=idle),
    ]
    for thread in threads:
        thread.start()
    tally = target.tallies.setdefault("slowloris (headers, body, idle)", Tally())
    deadline = time.monotonic() + READ_TIMEOUT_S
    while time.monotonic() < deadline:  # others are served while the trickles hang on
        good_request(target, tally)
    for thread in threads:
        thread.join(CLOSE_WITHIN_S + 5)
        assert not thread.is_alive()
    assert results["headers"][1] < len(head)  # cut off before its headers were complete
    assert status_of(results["headers"][0]) == 408
    assert results["idle"][0] == CLOSED  # nothing asked, nothing answered: just closed
    assert results["body"][1] < len(payload)  # cut off before its body was complete
    for answer, _ in results.values():
        expect_refused(tally, answer)


# --- Generated bodies: whatever JSON arrives, the answer is a 200 or a 4xx envelope. ---


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
JSON = st.recursive(SCALARS, _containers, max_leaves=12)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | JSON,
        "content": st.text(max_size=40) | JSON,
    },
)
FIELDS = {
    "model": st.just(SIM_MODEL) | JSON,
    "messages": st.lists(MESSAGE, min_size=1, max_size=3) | JSON,
    "max_tokens": st.integers(-5, 40) | JSON,
    "stream": st.booleans() | JSON,
    "n": st.integers(-1, 3) | JSON,
    "temperature": st.floats(-1, 3, allow_nan=False) | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | JSON}) | JSON,
    "stop": st.text(max_size=5) | JSON,
}
BODIES = st.fixed_dictionaries(
    {"model": FIELDS["model"], "messages": FIELDS["messages"]},
    optional={k: v for k, v in FIELDS.items() if k not in ("model", "messages")},
)


@settings(
    max_examples=60 * int(os.environ.get("FUZZ_SCALE", "1")),  # FUZZ_SCALE=20: a long run
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(payload=BODIES)
def test_generated_bodies_get_a_200_or_a_4xx_envelope(
    target: Target, payload: dict[str, Any]
) -> None:
    tally = target.tallies.setdefault("generated bodies (hypothesis)", Tally())
    tally.sent += 1
    response = post(target, orjson.dumps(payload))
    if response.status_code >= 500:
        tally.server_errors += 1
    assert response.status_code < 500, (payload, response.text[:300])
    if response.status_code >= 400:
        assert set(response.json()["error"]) == ENVELOPE_KEYS
        tally.refused += 1


def test_dot_segments_and_operator_routes_never_reach_a_backend(target: Target) -> None:
    payload = body()

    def request(path: bytes) -> bytes | str:
        head = HEAD.replace(b"/v1/chat/completions", path)
        answer = raw(
            target,
            head + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload),
        )
        assert status_of(answer) == 404, answer
        error = orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]  # type: ignore[union-attr]
        assert error["code"] == "unknown_url"  # the gateway's answer, not the backend's
        return answer

    paths = [
        b"/v1/../metrics",
        b"/v1/%2e%2e/metrics",
        b"/v1/..%2fmetrics",
        b"/v1/./chat/completions",
        b"/v1//chat/completions",
        b"/v1/chat/completions/..",
        b"/v1/%2E%2E/reset_prefix_cache",
        b"/v1/load_lora_adapter",  # vLLM's operator routes under /v1: not on the allow-list
        b"/v1/unload_lora_adapter",
    ]
    run_scenario(
        target, "path traversal and operator routes", [lambda p=p: request(p) for p in paths]
    )


def test_ambiguous_framing_is_400(target: Target) -> None:
    """Content-Length and Transfer-Encoding that disagree (request smuggling) are refused."""
    head = HEAD + b"Connection: close\r\n"
    framings = [
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"GET /health HTTP/1.1\r\n\r\n",
        b"Content-Length: 2\r\nContent-Length: 30\r\n\r\n{}",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n",
        b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    ]

    def request(framing: bytes) -> bytes | str:
        answer = raw(target, head + framing)
        assert status_of(answer) == 400, answer
        assert answer.count(b"HTTP/1.1 ") == 1  # type: ignore[union-attr]  (nothing smuggled)
        return answer

    run_scenario(
        target, "ambiguous framing (CL/TE smuggling)", [lambda f=f: request(f) for f in framings]
    )
