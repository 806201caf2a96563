"""Attribution end to end: a real gateway in front of a simulator, keys of two teams and one
of none, sent with the official client: each usage record carries its key's team, its end
user (the `user` field, or the configured header before it), its tags and its endpoint; the
usage filters find them; the savings report groups by each, read from the records (a period
inside the hour) and from the hourly rollups (whole hours), and every grouping adds up to
the same total. Bad attribution is refused with a 400 envelope and recorded. On SQLite and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleServerStarter,
    Server,
    fleet_backend,
    gateway_env,
    sim_args,
    spawn_server,
    write_fleet,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
USER_HEADER = "x-end-user"
WAIT_S = 60.0  # a deadline for the ledger's writes, not a wait
GROUPINGS = ("team", "user", "tags", "endpoint", "key", "model,team,tags")


@dataclass
class Stack:
    gateway: Server
    teams: dict[str, int]  # by name
    keys: dict[str, str]  # secret by name: "search" and "ads" (of those teams), "lone"

    def admin(self, path: str, **params: Any) -> Any:
        response = httpx.get(
            f"{self.gateway.base_url}/admin/v1{path}", params=params, headers=ADMIN, timeout=10
        )
        assert response.status_code == 200, response.text
        return response.json()

    def client(self, key: str) -> openai.OpenAI:
        url = f"{self.gateway.base_url}/v1"
        return openai.OpenAI(base_url=url, api_key=self.keys[key], max_retries=0)


def _post(gateway: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(
        f"{gateway.base_url}/admin/v1{path}", json=body, headers=ADMIN, timeout=10
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def stack(
    module_database: str,
    start_module_servers: ModuleServerStarter,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    [sim] = start_module_servers(sim_args("--time-scale", "50"))
    log_dir = tmp_path_factory.mktemp("gateway")
    fleet = write_fleet(log_dir / "fleet.yaml", [fleet_backend("b-plain", sim.base_url)])
    env = gateway_env(module_database, fleet, REQUIRE_API_KEY="true", USER_HEADER=USER_HEADER)
    gateway = spawn_server(("gateway",), env, log_dir)
    try:
        gateway.wait_healthy()
        teams = {n: int(_post(gateway, "/teams", {"name": n})["id"]) for n in ("search", "ads")}
        keys = {
            name: str(_post(gateway, "/keys", {"name": name, "team_id": teams.get(name)})["key"])
            for name in ("search", "ads", "lone")
        }
        yield Stack(gateway, teams, keys)
    finally:
        gateway.close()


def _chat(client: openai.OpenAI, **options: Any) -> None:
    client.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": f"hello {uuid.uuid4().hex}"}],
        max_tokens=4,
        **options,
    )


def _records(stack: Stack, count: int, **params: Any) -> list[dict[str, Any]]:
    """The usage records matching `params`, once `count` of them are written."""
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=WAIT_S)
    while True:
        found = stack.admin("/usage", limit=1000, **params)["data"]
        if len(found) >= count or dt.datetime.now(dt.UTC) > deadline:
            return list(found)
        time.sleep(0.2)  # the ledger writes in batches


def test_each_record_carries_its_team_user_tags_and_endpoint(stack: Stack) -> None:
    run = uuid.uuid4().hex[:8]
    search, ads, lone = stack.client("search"), stack.client("ads"), stack.client("lone")
    for _ in range(3):
        _chat(search, user=f"alice-{run}", extra_headers={"x-draftgate-tags": f"run-{run},chat"})
    _chat(ads, user=f"bob-{run}", extra_headers={USER_HEADER: f"carol-{run}"})  # header first
    ads.completions.create(
        model=SIM_MODEL, prompt="hi", max_tokens=2, extra_headers={"x-draftgate-tags": f"run-{run}"}
    )
    _chat(lone)
    tagged = _records(stack, 4, tag=f"run-{run}")
    assert len(tagged) == 4
    assert sorted((r["team_id"], r["endpoint"]) for r in tagged) == sorted(
        [(stack.teams["search"], "/v1/chat/completions")] * 3
        + [(stack.teams["ads"], "/v1/completions")]
    )
    assert {r["tags"] for r in tagged} == {f",chat,run-{run},", f",run-{run},"}
    [carol] = _records(stack, 1, user=f"carol-{run}")
    assert (carol["team_id"], carol["end_user"]) == (stack.teams["ads"], f"carol-{run}")
    assert _records(stack, 0, user=f"bob-{run}") == []  # the header came first
    alice = _records(stack, 3, user=f"alice-{run}", team=stack.teams["search"])
    assert len(alice) == 3
    assert _records(stack, 0, tag="run") == []  # a tag is matched whole, not by its start


def test_every_grouping_adds_up_to_the_same_total_from_records_and_rollups(
    stack: Stack,
) -> None:
    _chat(stack.client("search"), user="dave", extra_headers={"x-draftgate-tags": "a,b"})
    _records(stack, 1, user="dave")
    now = dt.datetime.now(dt.UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    inside = {"from": hour.isoformat(), "to": (now + dt.timedelta(seconds=1)).isoformat()}
    whole = {"from": hour.isoformat(), "to": (hour + dt.timedelta(hours=1)).isoformat()}
    for period in (inside, whole):  # the records alone; the rollups alone
        totals = set()
        for group_by in GROUPINGS:
            rows = stack.admin("/savings", group_by=group_by, **period)["data"]
            requests = sum(r["requests"] for r in rows)
            cost = round(sum(r["cost_usd"] for r in rows), 9)
            totals.add((requests, cost))
        assert len(totals) == 1, (period, totals)
    teams = stack.admin("/savings", group_by="team", **whole)["data"]
    assert {r["team"] for r in teams} >= {stack.teams["search"], stack.teams["ads"], None}
    tagged = stack.admin("/savings", group_by="tags,user", **whole)["data"]
    assert [r["requests"] for r in tagged if (r["tags"], r["end_user"]) == (",a,b,", "dave")]


def test_bad_attribution_is_refused_with_a_clear_error_and_recorded(stack: Stack) -> None:
    client = stack.client("lone")
    cases = {
        "nine tags": {"extra_headers": {"x-draftgate-tags": ",".join("abcdefghi")}},
        "a bad tag": {"extra_headers": {"x-draftgate-tags": "ok,no spaces"}},
        "a long user": {"user": "u" * 129},
    }
    for name, options in cases.items():
        with pytest.raises(openai.BadRequestError) as refused:
            _chat(client, **options)
        error = refused.value.body
        assert isinstance(error, dict), name
        assert error["code"] in ("invalid_tags", "invalid_user"), (name, error)
    records = _records(stack, 3, status=400, key=_key_id(stack, "lone"))
    assert len(records) >= 3
    assert {r["outcome"] for r in records} == {"rejected"}


def _key_id(stack: Stack, name: str) -> int:
    keys = stack.admin("/keys")["data"]
    return int(next(k["id"] for k in keys if k["name"] == name))


def test_a_team_refuses_what_its_key_alone_would_admit_and_says_so(stack: Stack) -> None:
    """A team whose budget is spent refuses its keys' requests with a 429 that names it;
    the key's own count is given back, so out of the team its one request a minute is
    served."""
    team = int(_post(stack.gateway, "/teams", {"name": "broke", "budget_usd": 0})["id"])
    body = {"name": "broke-1", "team_id": team, "requests_per_minute": 1}
    created = _post(stack.gateway, "/keys", body)
    stack.keys["broke"] = str(created["key"])
    client = stack.client("broke")
    with pytest.raises(openai.RateLimitError) as refused:
        _chat(client)
    message = str(refused.value.body["message"])  # type: ignore[index]
    assert message.startswith("Team `broke`: Budget exhausted"), message
    url = f"{stack.gateway.base_url}/admin/v1/keys/{created['id']}"
    moved = httpx.patch(url, json={"team_id": None}, headers=ADMIN, timeout=10)
    assert moved.status_code == 200, moved.text
    deadline = time.monotonic() + WAIT_S
    while True:  # until the gateway's registry has read the move
        try:
            _chat(client)
            break
        except openai.RateLimitError as still:
            message = str(still.body["message"])  # type: ignore[index]
            assert message.startswith("Team `broke`"), message  # not its own minute's limit
            assert time.monotonic() < deadline, "the key stayed refused out of its team"
            time.sleep(0.2)
