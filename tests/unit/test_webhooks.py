"""Webhooks without a network: the signature, the backoff schedule, the bounded queues and
their drop accounting, the events' shapes, budget crossings and the settings that guard them."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from gateway.events.budget_alerts import BudgetWatch
from gateway.events.webhooks import (
    BACKOFF_MAX_S,
    HANDOVER_S,
    Retry,
    WebhookEvent,
    WebhookSender,
    backend_health,
    backoff_s,
    method_moved,
    retryable,
    safe_url,
    sign,
)
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, KeyView, Snapshot, team_subject
from gateway.settings import Settings
from planner.cost import ThroughputCurve
from tests.webhook_receiver import verify

SECRET = "whsec-0123456789abcdef-unit"
TOKEN = "a-long-enough-random-token-xyz"


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"type":"backend.down"}'
    header = sign(SECRET.encode(), body, 1_800_000_000)
    expected = hmac.new(SECRET.encode(), b"1800000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1800000000,v1={expected}"
    assert verify(SECRET, body, header, now=1_800_000_010)  # the receiver's documented check
    assert not verify(SECRET, body + b" ", header, now=1_800_000_010)  # a changed body
    assert not verify("another-secret-0123456789", body, header, now=1_800_000_010)
    assert not verify(SECRET, body, header, now=1_800_000_000 + 301)  # a replay, too late


@pytest.mark.parametrize(
    ("retry", "jitter", "expected_s"),
    [
        (1, 0.0, 0.5),  # half the step at the least
        (1, 0.999999, 1.0),  # the whole step at the most
        (2, 0.0, 1.0),
        (3, 0.5, 4 * 0.75),
        (6, 0.0, 16.0),  # 32 s, halved
        (7, 0.999999, BACKOFF_MAX_S),  # 64 s: capped
        (30, 0.0, BACKOFF_MAX_S / 2),
    ],
)
def test_backoff_doubles_with_jitter_up_to_a_cap(
    retry: int, jitter: float, expected_s: float
) -> None:
    assert backoff_s(retry, 1.0, jitter) == pytest.approx(expected_s, rel=1e-5)


@pytest.mark.parametrize(
    ("status", "again"),
    [(500, True), (502, True), (503, True), (429, True), (400, False), (401, False),
     (404, False), (410, False), (301, False)],
)  # fmt: skip
def test_only_server_errors_and_429_are_retried(status: int, again: bool) -> None:
    assert retryable(status) is again


def test_logged_urls_lose_their_path_and_query() -> None:
    url = "https://hooks.example.com:8443/services/T000/B000/XXXXSECRET?token=abc"
    assert safe_url(url) == "https://hooks.example.com:8443"


@dataclass
class Decision:
    model: str = "m"
    before: str | None = "plain"
    after: str = "p-eagle"
    concurrency: float = 3.0
    usd_per_mtok: dict[str, float] = field(
        default_factory=lambda: {"plain": 0.41234567, "p-eagle": 0.2}
    )
    itl_ms: dict[str, float] = field(default_factory=lambda: {"plain": 9.0, "p-eagle": 4.0})
    request_class: str | None = None
    objective: str = "cost"


def test_a_move_lists_its_candidates_cheapest_first_with_their_curve_source() -> None:
    backends = tuple(
        BackendView(n, f"http://{n}", "m", method, None, "B200", 1)
        for n, method in (("a", "plain"), ("b", "p-eagle"))
    )
    snapshot = Snapshot(
        backends={"m": backends},
        prices={"B200": 6.0},
        curves={
            ("m", "plain", "B200"): ThroughputCurve((1, 64), (400, 20000)),
            ("m", "p-eagle", "B200"): ThroughputCurve((1, 64), (900, 15000)),
        },
    )
    event = json.loads(method_moved(Decision(), snapshot).model_dump_json())
    assert (event["type"], event["model"], event["backend"]) == ("method.moved", "m", None)
    data = event["data"]
    assert (data["before"], data["after"], data["request_class"]) == ("plain", "p-eagle", None)
    assert [c["method"] for c in data["candidates"]] == ["p-eagle", "plain"]
    assert data["candidates"][1] == {
        "method": "plain",
        "usd_per_mtok": 0.412346,
        "itl_ms": 9.0,
        "curve_source": None,  # no measured band behind these curves
    }


def event(n: int) -> WebhookEvent:
    backend = BackendView(f"b{n}", "http://b", "m", "plain", None, "B200", 1)
    return backend_health(backend, healthy=n % 2 == 0, probe="down")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:  # never used: nothing here is delivered
        yield http


async def test_a_full_queue_drops_its_oldest_event_and_counts_it(
    client: httpx.AsyncClient,
) -> None:
    metrics = GatewayMetrics()
    urls = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
    sender = WebhookSender(
        urls, SecretStr(SECRET), client, metrics, queue_size=3, retry=Retry(1, 0.1), replica="r1"
    )
    for n in range(5):  # no worker runs: the queues only fill
        sender.emit(event(n))
    assert sender.queued == 6  # three per URL
    dropped = metrics.registry.get_sample_value
    assert dropped("draftgate_webhook_events_total", {"type": "backend.up", "outcome": "dropped"})
    assert dropped("draftgate_webhook_queued") == 6
    counted = sum(
        dropped("draftgate_webhook_events_total", {"type": t, "outcome": "dropped"}) or 0
        for t in ("backend.up", "backend.down")
    )
    assert counted == 4  # events 0 and 1, on each URL
    kept = [json.loads(p.body)["backend"] for p in sender._destinations[0].queue._queue]  # type: ignore[attr-defined]
    assert kept == ["b2", "b3", "b4"]  # the newest stay
    assert json.loads(sender._destinations[0].queue._queue[0].body)["replica"] == "r1"  # type: ignore[attr-defined]


async def test_a_worker_that_takes_over_sends_what_it_saw_in_the_hand_over(
    client: httpx.AsyncClient,
) -> None:
    now = [100.0]
    sender = WebhookSender(["http://127.0.0.1:9/"], None, client, GatewayMetrics(),
                           queue_size=10, retry=Retry(1, 0.1), clock=lambda: now[0])  # fmt: skip
    sender.leading = False  # a worker that follows its replica's leader
    sender.emit(event(1))  # long before the leader died: the leader sent it
    now[0] += HANDOVER_S + 5
    sender.emit(event(2))  # just before: the dead leader may not have
    now[0] += 0.5  # the lock's poll: this worker leads
    assert sender.queued == 0
    sender.lead()
    queue = sender._destinations[0].queue._queue  # type: ignore[attr-defined]
    assert [json.loads(p.body)["backend"] for p in queue] == ["b2"]
    sender.emit(event(3))  # and sends from now on
    assert [json.loads(p.body)["backend"] for p in queue] == ["b2", "b3"]


async def test_emit_from_another_thread_queues_on_the_loop(client: httpx.AsyncClient) -> None:
    sender = WebhookSender(
        ["http://127.0.0.1:9/"], None, client, GatewayMetrics(), queue_size=5, retry=Retry(1, 1)
    )
    thread = threading.Thread(target=sender.emit, args=(event(1),))
    thread.start()
    thread.join()
    for _ in range(100):  # the loop runs the hand-over at its next turn
        if sender.queued:
            break
        await asyncio.sleep(0)
    assert sender.queued == 1


def key(budget: float | None = 10.0, period: str = "daily", key_id: int = 7) -> KeyView:
    return KeyView(key_id, "team-a", None, None, budget, period, None)


class Sink:
    """Stands in for the sender: what a watch would send."""

    def __init__(self) -> None:
        self.events: list[WebhookEvent] = []

    def emit(self, event: WebhookEvent) -> None:
        self.events.append(event)


def spending(usd: float, view: KeyView | None = None) -> Snapshot:
    view = view or key()
    return Snapshot(keys={"h": view}, key_spend_usd={view.id: usd})


def thresholds(watch: BudgetWatch, snapshot: Snapshot) -> list[float]:
    return [e.data.threshold for e in watch.crossings(snapshot)]  # type: ignore[union-attr]


def test_each_threshold_fires_once_per_crossing_not_per_look() -> None:
    watch = BudgetWatch((1.0, 0.8), Sink())  # type: ignore[arg-type]
    assert thresholds(watch, spending(5.0)) == []
    assert thresholds(watch, spending(8.0)) == [0.8]
    assert thresholds(watch, spending(8.5)) == []  # still past 80%: nothing new
    assert thresholds(watch, spending(9.9)) == []
    assert thresholds(watch, spending(12.0)) == [1.0]
    assert thresholds(watch, spending(12.0)) == []


def test_a_jump_past_both_thresholds_sends_both() -> None:
    watch = BudgetWatch((0.8, 1.0), Sink())  # type: ignore[arg-type]
    assert thresholds(watch, spending(11.0)) == [0.8, 1.0]


def test_a_raised_budget_or_a_fall_below_arms_a_threshold_again() -> None:
    watch = BudgetWatch((0.8,), Sink())  # type: ignore[arg-type]
    assert thresholds(watch, spending(9.0)) == [0.8]
    assert thresholds(watch, spending(9.0, key(budget=20.0))) == []  # 45% of the new budget
    assert thresholds(watch, spending(17.0, key(budget=20.0))) == [0.8]
    assert thresholds(watch, spending(1.0, key(budget=20.0))) == []  # a new period began
    assert thresholds(watch, spending(16.0, key(budget=20.0))) == [0.8]


def test_keys_without_a_budget_are_not_watched() -> None:
    watch = BudgetWatch((0.8,), Sink())  # type: ignore[arg-type]
    assert thresholds(watch, spending(100.0, key(budget=None))) == []
    assert thresholds(watch, spending(100.0, key(budget=0.0))) == []


def test_every_replica_gives_one_crossing_the_same_id() -> None:
    first, second = (BudgetWatch((0.8,), Sink()) for _ in range(2))  # type: ignore[arg-type]
    [a] = first.crossings(spending(9.0))
    [b] = second.crossings(spending(9.5))
    assert a.id == b.id
    [c] = second.crossings(spending(9.5, key(budget=10.5)))  # another budget: another crossing
    assert c.id != a.id
    data = json.loads(a.model_dump_json())["data"]
    start = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert data == {
        "key_id": 7,
        "key_name": "team-a",
        "budget_usd": 10.0,
        "budget_period": "daily",
        "period_start": start.isoformat().replace("+00:00", "Z"),
        "spent_usd": 9.0,
        "fraction": 0.9,
        "threshold": 0.8,
    }


def test_check_sends_what_it_finds() -> None:
    sink = Sink()
    BudgetWatch((0.8,), sink).check(spending(9.0))  # type: ignore[arg-type]
    assert [e.type for e in sink.events] == ["budget.threshold"]


def test_webhook_urls_need_a_strong_secret_outside_dev_mode() -> None:
    url = "https://hooks.example.com/T000/XXXXSECRET"
    with pytest.raises(ValidationError, match="DRAFTGATE_WEBHOOK_SECRET"):
        Settings(admin_token=TOKEN, webhook_urls=url)
    with pytest.raises(ValidationError, match="DRAFTGATE_WEBHOOK_SECRET"):
        Settings(admin_token=TOKEN, webhook_urls=url, webhook_secret="changeme")
    assert Settings(admin_token=TOKEN, webhook_urls=url, dev_mode=True).webhook_secret is None
    settings = Settings(admin_token=TOKEN, webhook_urls=f" {url} ,http://127.0.0.1:9000/h",
                        webhook_secret=SECRET)  # fmt: skip
    assert settings.webhook_url_list == (url, "http://127.0.0.1:9000/h")
    assert SECRET not in repr(settings)


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/XXXXSECRET", "hooks/XXXXSECRET"])
def test_a_webhook_url_that_is_no_http_url_is_refused_without_repeating_it(url: str) -> None:
    with pytest.raises(ValidationError, match="no http") as refused:
        Settings(admin_token=TOKEN, webhook_urls=url, webhook_secret=SECRET)
    assert "XXXXSECRET" not in str(refused.value)


def test_budget_thresholds_are_sorted_fractions() -> None:
    settings = Settings(admin_token=TOKEN, webhook_budget_thresholds="1,0.5,0.80")
    assert settings.budget_thresholds == (0.5, 0.8, 1.0)
    with pytest.raises(ValidationError):
        Settings(admin_token=TOKEN, webhook_budget_thresholds="0,0.8")
    with pytest.raises(ValidationError):
        Settings(admin_token=TOKEN, webhook_budget_thresholds="80%")


def test_without_urls_no_sender_exists() -> None:
    assert WebhookSender.of(Settings(admin_token=TOKEN), GatewayMetrics()) is None


def test_a_teams_budget_crossing_is_its_own_event_beside_its_keys() -> None:
    """A team's spend is watched as a key's is, and sent as `team.budget.threshold`."""
    team = KeyView(team_subject(3), "search", None, None, 10.0, "total", None)
    member = key()
    snapshot = Snapshot(
        keys={"h": member},
        teams={3: team},
        key_spend_usd={member.id: 1.0, team.id: 9.0},
    )
    watch = BudgetWatch((0.8,), Sink())  # type: ignore[arg-type]
    [event] = watch.crossings(snapshot)
    assert watch.crossings(snapshot) == []  # once per crossing
    assert event.type == "team.budget.threshold"
    assert json.loads(event.model_dump_json())["data"] == {
        "team_id": 3,
        "team_name": "search",
        "budget_usd": 10.0,
        "budget_period": "total",
        "period_start": None,
        "spent_usd": 9.0,
        "fraction": 0.9,
        "threshold": 0.8,
    }
