"""A pool through a real gateway: simulators on four loopback addresses found, once, by one
name at a real DNS server (dnsmasq) on SQLite, and once as one Service's ready endpoints
through the stand-in Kubernetes API (tests/kube_api.py) on the real PostgreSQL; the test
changes the records or the endpoints."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import new_postgres_schema
from tests.dns_server import DnsServer
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    HEALTH_TIMEOUT_S,
    SIM_MODEL,
    Server,
    draftgate_env,
    free_port,
    gateway_env,
    metric_value,
    query_rows,
    sim_args,
    spawn_server,
)
from tests.kube_api import KubeApi

NAME = "sims.test"
SERVICE, NAMESPACE = "vllm-sims", "serving"  # found through the Kubernetes API instead
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 7)]  # the fifth is started by a test
WAIT_S = 30.0  # a deadline, not a wait
SIM_OPTIONS = ("--time-scale", "20", "--gpu", "B200", "--max-model-len", "65536")
POOL = {
    "name": "sims",
    "backend": {
        "model": SIM_MODEL,
        "method": "p-eagle",
        "k": 7,
        "drafter": "amazon/GPT-OSS-20B-P-EAGLE",
        "gpu_type": "B200",
    },
}


class Fleet:
    """Where the members are found (the DNS server, or the stand-in Kubernetes API when
    `kube` is given), the simulators by address (all on one port) and the gateway."""

    def __init__(
        self,
        directory: Path,
        sim_options: tuple[str, ...] = SIM_OPTIONS,
        pool: dict[str, Any] = POOL,
        database_url: str | None = None,
        kube: KubeApi | None = None,
        sim_env: dict[str, str] | None = None,
        **settings: str,
    ) -> None:
        self.directory, self.sim_options, self.pool = directory, sim_options, pool
        self.sim_env = sim_env or {}
        self.settings = {"DISCOVERY_INTERVAL_S": "0.2", "COLLECT_INTERVAL_S": "0.5"} | settings
        self.port = free_port()
        self.kube = kube
        self.dns = DnsServer(directory)
        self.sims: dict[str, Server] = {}
        self.gateway: Server | None = None
        self.database_url = database_url or f"sqlite:///{directory}/draftgate.db"

    def start_sim(self, address: str) -> None:
        args = (*sim_args(*self.sim_options), "--host", address)
        sim = spawn_server(args, draftgate_env(**self.sim_env), self.directory, port=self.port)
        self.sims[address] = sim
        _wait(lambda: _answers(f"http://{address}:{self.port}/health"), f"{address} up")

    def start_gateway(self, models: list[dict[str, Any]] | None = None) -> Server:
        source = {"dns": NAME} if self.kube is None else {"service": SERVICE}
        pool = self.pool | {"discovery": {**source, "port": self.port}}
        fleet = self.directory / "fleet.yaml"
        document: dict[str, Any] = {"pools": [pool], "models": models or []}
        fleet.write_text(yaml.safe_dump(document), encoding="utf-8")
        self.fleet_file = fleet
        self.gateway = spawn_server(("gateway",), self.env(), self.directory)
        self.gateway.wait_healthy()
        return self.gateway

    def env(self) -> dict[str, str]:
        """A gateway's environment: this fleet's database, fleet file and DNS server (or
        Kubernetes API and service account)."""
        found_at = {"DNS_SERVER": self.dns.address}
        if self.kube is not None:
            account = self.directory / "serviceaccount"
            account.mkdir(exist_ok=True)
            (account / "token").write_text(self.kube.token)
            (account / "namespace").write_text(NAMESPACE)
            found_at = {"KUBE_API_URL": self.kube.url, "KUBE_SERVICE_ACCOUNT_DIR": str(account)}
        return gateway_env(self.database_url, self.fleet_file, **found_at, **self.settings)

    def set_members(self, addresses: list[str], not_ready: tuple[str, ...] = ()) -> None:
        """The addresses the pool's source gives: DNS records, or ready endpoints (and the
        `not_ready` ones: pods starting or terminating)."""
        if self.kube is None:
            self.dns.set(NAME, addresses)
        else:
            endpoints = {a: True for a in addresses} | {a: False for a in not_ready}
            self.kube.set_endpoints(NAMESPACE, SERVICE, endpoints)

    def members(self) -> dict[str, Any]:
        assert self.gateway is not None
        with self.gateway.client(ADMIN_TOKEN) as admin:
            listed = admin.get("/admin/v1/backends").json()["data"]
        return {b["name"]: b for b in listed if b["pool"] == "sims"}

    def close(self) -> None:
        for server in [*self.sims.values(), *([self.gateway] if self.gateway else [])]:
            server.close()
        self.dns.stop()


def dns_fleet(
    stack: contextlib.ExitStack,
    database: str,
    directory: Path,
    members: list[str],
    sim_options: tuple[str, ...],
    **settings: str,
) -> Fleet:
    """Simulators at `members` behind the pool's DNS name, on `database` ("sqlite", or
    "postgres": a fresh schema), closed with `stack`; the gateway is the caller's to start."""
    database_url = None
    if database == "postgres":
        database_url = stack.enter_context(new_postgres_schema())
    fleet = Fleet(directory, sim_options, database_url=database_url, **settings)
    stack.callback(fleet.close)
    for address in members:
        fleet.start_sim(address)
    fleet.dns.set(NAME, members)
    return fleet


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def _wait(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never {what} within {timeout_s} s")
        time.sleep(0.1)


def member(fleet: Fleet, address: str) -> str:
    return f"sims:{address}:{fleet.port}"


KUBE_TOKEN = "stand-in-service-account-token"
SOURCES = [
    pytest.param("dns", id="dns-sqlite"),
    pytest.param("kubernetes", id="kubernetes-postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(scope="module", params=SOURCES)
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        directory = tmp_path_factory.mktemp(f"pool-{request.param}")
        if request.param == "dns":
            fleet = Fleet(directory)
        else:
            kube = stack.enter_context(KubeApi(KUBE_TOKEN, {NAMESPACE}))
            postgres = stack.enter_context(new_postgres_schema())
            fleet = Fleet(directory, database_url=postgres, kube=kube)
        stack.callback(fleet.close)
        for address in ADDRESSES[:4]:
            fleet.start_sim(address)
        fleet.set_members(ADDRESSES)  # the fifth address answers nothing yet
        fleet.start_gateway()
        yield fleet


def _chat(gateway: Server, prompt: str | None = None) -> httpx.Response:
    """One completion; a new conversation each time unless `prompt` is given."""
    body = {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": prompt or f"{uuid.uuid4()} hello"}],
        "max_tokens": 8,
    }
    return httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30)


def test_each_address_that_answers_health_becomes_a_member(fleet: Fleet) -> None:
    wanted = {member(fleet, a) for a in ADDRESSES[:4]}
    _wait(lambda: set(fleet.members()) == wanted, "four members", HEALTH_TIMEOUT_S)
    members = fleet.members()
    assert members[member(fleet, "127.0.0.2")]["url"] == f"http://127.0.0.2:{fleet.port}"
    assert {m["method"] for m in members.values()} == {"p-eagle"}
    # the fifth address is in DNS but nothing serves there: probed, never a member
    assert member(fleet, ADDRESSES[4]) not in members
    audit = query_rows(
        fleet.database_url,
        "SELECT actor, action, resource_id FROM audit_log WHERE resource_type = 'backend'",
    )
    assert {(a["actor"], a["action"]) for a in audit} == {("discovery", "create")}
    assert {a["resource_id"] for a in audit} == wanted
    _all_five(fleet)  # its pod became ready: it joins at a next round
    # the per-backend series say which pool each member is of
    assert fleet.gateway is not None
    healthy = lambda: metric_value(fleet.gateway.base_url, "draftgate_backend_healthy", pool="sims")  # noqa: E731
    _wait(lambda: healthy() == len(ADDRESSES), "every member's health series in the pool")


def _all_five(fleet: Fleet) -> None:
    """Every address serving and a member (each test of the module can run alone)."""
    if ADDRESSES[4] not in fleet.sims:
        fleet.start_sim(ADDRESSES[4])
    fleet.set_members(ADDRESSES)
    wanted = {member(fleet, a) for a in ADDRESSES}
    _wait(lambda: set(fleet.members()) == wanted, "five members")


def test_conversations_spread_over_the_members_and_each_keeps_to_one(fleet: Fleet) -> None:
    assert fleet.gateway is not None
    _all_five(fleet)
    served = []
    for _ in range(60):
        response = _chat(fleet.gateway)
        assert response.status_code == 200, response.text
        served.append(response.headers["x-draftgate-backend"])
    assert set(served) == set(fleet.members())  # every member took some
    # one conversation's turns go to the member that caches its prefix
    turns = [_chat(fleet.gateway, "the same opening question") for _ in range(10)]
    homes = [t.headers["x-draftgate-backend"] for t in turns if _went_home(t)]
    assert len(set(homes)) == 1, homes
    # A turn may spill (and says so) only while a scrape shows its member with a queue: a
    # moment's, at rest. Its own last turn no longer counts (tests/e2e/test_occupancy.py).
    assert len(homes) >= 8, [t.headers["x-draftgate-affinity"] for t in turns]


def _went_home(response: httpx.Response) -> bool:
    outcome = response.headers["x-draftgate-affinity"]
    assert outcome in {"home", "spilled"}
    return outcome == "home"


def _homed_on(fleet: Fleet, name: str) -> str:
    """A conversation opening whose turns go to member `name`."""
    assert fleet.gateway is not None
    for _ in range(200):
        opening = f"{uuid.uuid4()} tell me a story"
        if _chat(fleet.gateway, opening).headers["x-draftgate-backend"] == name:
            return opening
    pytest.fail(f"no opening of 200 went to {name}")


class _Stream:
    """A long streamed completion whose first event has arrived; the rest is read at
    `finish`, so until then it is in flight: its 40,000 tokens' events (over 6 MB) are
    more than the kernel's socket buffers and the gateway's hold (about 4 MB)."""

    def __init__(self, gateway: Server, opening: str) -> None:
        self.client = httpx.Client(base_url=gateway.base_url, timeout=120)
        body = {
            "model": SIM_MODEL,
            "messages": [{"role": "user", "content": opening}],
            "max_tokens": 40_000,
            "ignore_eos": True,
            "stream": True,
        }
        self.response = self.client.send(
            self.client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )
        self.lines = self.response.iter_lines()
        assert next(self.lines).startswith("data:")

    def finish(self) -> str | None:
        """Read to the end; the finish reason of the last choice."""
        reason, self.bytes = None, 0
        try:
            for line in self.lines:
                self.bytes += len(line) + 2
                if line.startswith("data: {"):
                    choices = json.loads(line.removeprefix("data: "))["choices"]
                    reason = (choices and choices[0].get("finish_reason")) or reason
        finally:
            self.response.close()
            self.client.close()
        return reason


def test_an_address_gone_is_drained_without_a_failed_request(fleet: Fleet) -> None:
    """Gone from DNS; through the API, its pod terminating (its endpoint no longer ready)."""
    assert fleet.gateway is not None
    _all_five(fleet)
    gone = ADDRESSES[0]
    opening = _homed_on(fleet, member(fleet, gone))
    stream = _Stream(fleet.gateway, opening)  # in flight on the member as it leaves
    fleet.set_members(ADDRESSES[1:], not_ready=(gone,))
    failures = []
    deadline = time.monotonic() + WAIT_S
    while member(fleet, gone) in fleet.members():
        response = _chat(fleet.gateway)
        if response.status_code != 200:
            failures.append(response.text)
        assert time.monotonic() < deadline, "the member was never removed"
    assert failures == []
    audit = query_rows(
        fleet.database_url,
        "SELECT actor FROM audit_log WHERE resource_id = :name AND action = 'delete'",
        name=member(fleet, gone),
    )
    assert [a["actor"] for a in audit] == ["discovery"]
    assert stream.finish() == "length"  # it went on to its last token
    assert stream.bytes > 6_000_000
    served = {_chat(fleet.gateway).headers["x-draftgate-backend"] for _ in range(20)}
    assert member(fleet, gone) not in served
    # its GPU time was billed from its joining to its leaving, and no longer
    stays = member(fleet, ADDRESSES[1])
    first = _gpu_hours(fleet)
    assert first[member(fleet, gone)] > 0
    _wait(lambda: _gpu_hours(fleet)[stays] > first[stays], "a member's GPU time grew")
    assert _gpu_hours(fleet)[member(fleet, gone)] == first[member(fleet, gone)]


def test_a_pod_not_ready_takes_no_traffic_though_it_answers_health(fleet: Fleet) -> None:
    if fleet.kube is None:
        pytest.skip("a headless Service's DNS name answers only ready pods: no condition to read")
    _all_five(fleet)
    waiting = ADDRESSES[2]
    fleet.set_members([a for a in ADDRESSES if a != waiting], not_ready=(waiting,))
    _wait(lambda: member(fleet, waiting) not in fleet.members(), "the unready pod removed")
    assert _answers(f"http://{waiting}:{fleet.port}/health")  # its server still answers
    assert fleet.gateway is not None
    served = {_chat(fleet.gateway).headers["x-draftgate-backend"] for _ in range(20)}
    assert member(fleet, waiting) not in served
    fleet.set_members(ADDRESSES)  # ready again
    _wait(lambda: member(fleet, waiting) in fleet.members(), "the pod back once ready")
    # the gateway read the API as its service account, listing once and then watching
    assert {r["token"] for r in fleet.kube.requests} == {f"Bearer {KUBE_TOKEN}"}
    assert fleet.kube.watches() >= 1


def _gpu_hours(fleet: Fleet) -> dict[str, float]:
    """GPU-hours each backend was held, from the spend report."""
    assert fleet.gateway is not None
    with fleet.gateway.client(ADMIN_TOKEN) as admin:
        rows = admin.get("/admin/v1/spend").json()["data"]
    return {r["backend"]: r["gpu_hours"] for r in rows}


def test_an_outage_of_the_source_keeps_the_pool_and_says_so(fleet: Fleet) -> None:
    """The DNS server stopped; the Kubernetes API answering 503."""
    gateway = fleet.gateway
    assert gateway is not None
    _wait(lambda: bool(fleet.members()), "members found (the test can run alone)")
    before = set(fleet.members())
    ok = lambda: metric_value(gateway.base_url, "draftgate_pool_discovery_ok", pool="sims")  # noqa: E731
    _wait(lambda: ok() == 1, "discovery ok")
    if fleet.kube is None:
        fleet.dns.stop()
    else:
        fleet.kube.fail(503)
    try:
        _wait(lambda: ok() == 0, "discovery said it failed")
        assert set(fleet.members()) == before
        response = _chat(gateway)
        assert response.status_code == 200, response.text
        assert "keeping its members" in gateway.output()
        ready = httpx.get(f"{gateway.base_url}/ready", timeout=5)
        assert ready.status_code == 200  # still ready, on the members kept
        expected = (
            "cannot resolve sims.test"
            if fleet.kube is None
            else f"service {NAMESPACE}/{SERVICE}: 503 ServiceUnavailable"
        )
        # The first reason may be the open watch cut as the API fails ("Server disconnected");
        # the next list or watch says what the source answers now.
        _wait(lambda: _failing(gateway).startswith(expected), f"the reason {expected!r}")
    finally:
        if fleet.kube is None:
            fleet.dns.start()
        else:
            fleet.kube.fail(None)
    _wait(lambda: ok() == 1, "discovery recovered")
    assert set(fleet.members()) == before
    _wait(lambda: "discovery_failing" not in httpx.get(f"{gateway.base_url}/ready").json(), "ready")


def _failing(gateway: Server) -> str:
    """Why /ready says the pool's discovery fails ("" when it does not)."""
    failing = httpx.get(f"{gateway.base_url}/ready", timeout=5).json().get("discovery_failing")
    return str((failing or {}).get("sims", ""))


def test_a_second_gateway_replica_discovers_the_same_members_once(fleet: Fleet) -> None:
    """One replica discovers for all (it holds the discovery lease): each member is added
    and audited once, however quickly it goes and comes back; when that replica stops, the
    other takes over."""
    _all_five(fleet)
    first = fleet.gateway
    assert first is not None
    second = spawn_server(("gateway",), fleet.env(), fleet.directory)
    try:
        second.wait_healthy()
        _wait(lambda: ready_members(second) == len(ADDRESSES), "the second replica ready")
        gone = ADDRESSES[1]
        for _ in range(3):  # gone and back, faster than a lagging watch would see
            fleet.set_members([a for a in ADDRESSES if a != gone])
            _wait(lambda: member(fleet, gone) not in fleet.members(), "the member removed")
            fleet.set_members(ADDRESSES)
            _wait(lambda: member(fleet, gone) in fleet.members(), "the member back")
        audit = query_rows(
            fleet.database_url,
            "SELECT actor, action FROM audit_log WHERE resource_id = :name ORDER BY id",
            name=member(fleet, gone),
        )
        actions = [(a["actor"], a["action"]) for a in audit]
        assert actions == [("discovery", "create")] + 3 * [
            ("discovery", "delete"),
            ("discovery", "create"),
        ]
        assert "another replica leads it" not in first.output()
        first.close()  # the replica that discovers stops: the other takes over at once
        fleet.gateway = second
        fleet.set_members([a for a in ADDRESSES if a != gone])
        _wait(lambda: member(fleet, gone) not in fleet.members(), "removed by the second")
        assert "pool discovery: this replica leads it" in second.output()
        assert "discovery round failed" not in second.output() + first.output()
    finally:
        fleet.set_members(ADDRESSES)
        second.close()


def ready_members(server: Server) -> int:
    """Backends the replica's /ready counts healthy (0 while it is not ready: a 503)."""
    answer = httpx.get(f"{server.base_url}/ready", timeout=5)
    return int(answer.json()["backends_healthy"]) if answer.status_code == 200 else 0
