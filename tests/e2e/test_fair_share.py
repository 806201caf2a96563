"""Fair share under saturation through a real gateway: a plain simulator whose room within
the model's ITL objective is a few streams, two teams each sending more than it serves. Team
`long` sends 8k-token prompts, team `short` short ones. First come, first served (the fair
share off) gives `short` the few tokens its small requests carry; fair share gives it half
the tokens served, its weight, the long team's requests waiting their turn. A request that
outwaits the queue's timeout is a 429 with `Retry-After`."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    price_gpu,
    sim_args,
)

ROOM = 4  # streams the backend serves within the objective the test sets
CLIENTS = 8  # each team's clients, each sending one request after another
LONG_PROMPT = 8000  # tokens
COMPLETION = 48  # tokens each request generates (both teams)
WARM_S = 4.0  # the contention settles first
MEASURE_S = 30.0  # then the served tokens are counted for this long


@dataclass
class Served:
    """Tokens served per team in the window, and what else was answered."""

    tokens: dict[str, int] = field(default_factory=lambda: {"long": 0, "short": 0})
    requests: dict[str, int] = field(default_factory=lambda: {"long": 0, "short": 0})
    refused: int = 0

    def share(self, team: str) -> float:
        return self.tokens[team] / sum(self.tokens.values())


@pytest.fixture(scope="module")
def sim(start_module_servers: ModuleServerStarter) -> Server:
    (server,) = start_module_servers(sim_args("--method", "plain", "--time-scale", "4"))
    return server


def _start(start: ModuleGatewayStarter, sim: Server, fair: bool) -> tuple[Server, dict[str, str]]:
    """A gateway on the simulator with the objective set and a key for each team."""
    server, _ = start(
        [fleet_backend("fair-plain", sim.base_url)],
        FAIR_SHARE=str(fair).lower(),
        FAIR_QUEUE_TIMEOUT_S="60",
    )
    price_gpu(server, ["plain"])
    line = httpx.get(
        f"{server.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
    ).json()["curves"][0]["line"]
    itl = {p["concurrency"]: 1000 * p["concurrency"] / p["output_tokens_per_s"] for p in line}
    objective = itl[ROOM] * 1.001  # room for ROOM streams (the ITL grows with each one)
    policy = {"mode": "pinned", "method": "plain", "itl_objective_ms": round(objective, 4)}
    answer = httpx.put(
        f"{server.base_url}/admin/v1/models/{SIM_MODEL}/policy", json=policy, headers=ADMIN
    )
    assert answer.status_code == 200, answer.text
    keys = {}
    for team in ("long", "short"):
        made = httpx.post(f"{server.base_url}/admin/v1/teams", json={"name": team}, headers=ADMIN)
        assert made.status_code == 201, made.text
        key = {"name": f"{team}-key", "team_id": made.json()["id"]}
        issued = httpx.post(f"{server.base_url}/admin/v1/keys", json=key, headers=ADMIN)
        assert issued.status_code == 201, issued.text
        keys[team] = issued.json()["key"]
    return server, keys


def _body(team: str) -> dict[str, object]:
    words = LONG_PROMPT if team == "long" else 20
    # a word of its own first: the simulator's prefix cache does not spare its prefill
    prompt = f"{uuid.uuid4().hex} " + "abc " * (words - 1)
    return {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": COMPLETION,
        "ignore_eos": True,
    }


async def _load(gateway: Server, keys: dict[str, str]) -> Served:
    """Both teams' clients sending back to back; the tokens of the requests that end in the
    window, by team."""
    served = Served()
    start = time.monotonic()
    window = (start + WARM_S, start + WARM_S + MEASURE_S)

    async def client(http: httpx.AsyncClient, team: str) -> None:
        headers = {"authorization": f"Bearer {keys[team]}"}
        while time.monotonic() < window[1]:
            answer = await http.post("/v1/chat/completions", json=_body(team), headers=headers)
            if answer.status_code == 429:
                served.refused += 1
                continue
            assert answer.status_code == 200, answer.text
            if window[0] <= time.monotonic() <= window[1]:
                usage = answer.json()["usage"]
                served.tokens[team] += usage["prompt_tokens"] + usage["completion_tokens"]
                served.requests[team] += 1

    limits = httpx.Limits(max_connections=2 * CLIENTS + 2)
    async with httpx.AsyncClient(base_url=gateway.base_url, limits=limits, timeout=120) as http:
        await asyncio.gather(
            *(client(http, team) for team in ("long", "short") for _ in range(CLIENTS))
        )
    return served


def test_a_team_of_short_prompts_gets_its_weight_of_a_full_backend(
    start_module_gateway: ModuleGatewayStarter, sim: Server
) -> None:
    fcfs_gateway, keys = _start(start_module_gateway, sim, fair=False)
    fcfs = asyncio.run(_load(fcfs_gateway, keys))
    fair_gateway, keys = _start(start_module_gateway, sim, fair=True)
    fair = asyncio.run(_load(fair_gateway, keys))
    for name, served in (("first come, first served", fcfs), ("fair share", fair)):
        print(
            f"{name}: short team's share of tokens {served.share('short'):.3f} "
            f"(tokens {served.tokens}, requests {served.requests}, 429s {served.refused})"
        )
    assert fair.refused == 0
    assert fcfs.refused == 0
    assert fair.requests["long"] >= 3  # the long team is served too, in its turn
    assert abs(fair.share("short") - 0.5) <= 0.05  # within 10% of its weight, 0.5
    assert fcfs.share("short") < 0.25
    waited = metric_value(
        fair_gateway.base_url, "draftgate_fair_queue_wait_seconds_count", model=SIM_MODEL
    )
    assert waited > 0
    assert metric_value(fcfs_gateway.base_url, "draftgate_fair_queue_wait_seconds_count") == 0


def test_only_a_backend_that_schedules_by_priority_is_sent_the_teams_priority(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> None:
    """Three models, each on a simulator that answers a non-zero `priority` 400 unless it
    schedules by priority, as vLLM does: declared `fcfs`, it is sent none; declared
    `priority` it is sent the team's, over the client's own (one wrongly declared proves it)."""
    fcfs, wrong, by_priority = start_module_servers(
        sim_args("--method", "plain", "--served-model-name", "fcfs-model"),
        sim_args("--method", "plain", "--served-model-name", "wrong-model"),
        sim_args(
            "--method", "plain", "--served-model-name", "priority-model",
            "--scheduling-policy", "priority",
        ),
    )  # fmt: skip
    gateway, _ = start_module_gateway(
        [
            fleet_backend("prio-fcfs", fcfs.base_url, model="fcfs-model"),
            fleet_backend("prio-wrong", wrong.base_url, model="wrong-model", scheduling="priority"),
            fleet_backend(
                "prio-priority", by_priority.base_url, model="priority-model", scheduling="priority"
            ),
        ]
    )
    team = {"name": "urgent", "priority": -5}
    made = httpx.post(f"{gateway.base_url}/admin/v1/teams", json=team, headers=ADMIN)
    assert made.status_code == 201, made.text
    assert made.json()["priority"] == -5
    key = {"name": "urgent-key", "team_id": made.json()["id"]}
    issued = httpx.post(f"{gateway.base_url}/admin/v1/keys", json=key, headers=ADMIN)
    headers = {"authorization": f"Bearer {issued.json()['key']}"}

    def ask(model: str, **extra: object) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return httpx.post(
            f"{gateway.base_url}/v1/chat/completions",
            json=body | extra,
            headers=headers,
            timeout=30,
        )

    assert ask("fcfs-model").status_code == 200  # not sent: it would refuse it
    assert ask("priority-model").status_code == 200
    assert ask("priority-model", priority=50).status_code == 200  # the team's wins
    refused = ask("wrong-model")  # declared priority, serving fcfs: it was sent -5
    assert refused.status_code == 400
    assert "Got priority -5 but Priority scheduling is not enabled" in refused.text
    backends = httpx.get(f"{gateway.base_url}/admin/v1/backends", headers=ADMIN).json()
    declared = {b["name"]: b["scheduling"] for b in backends["data"]}
    assert declared == {"prio-fcfs": "fcfs", "prio-wrong": "priority", "prio-priority": "priority"}
