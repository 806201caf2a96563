"""The Responses API's stored responses across a pool's members, through a real gateway with
the official `openai` client: three simulators that store responses as vLLM does with
`VLLM_ENABLE_RESPONSES_API_STORE=1`, found by DNS (dnsmasq). A stored response lives on the
member that made it, so every later turn, retrieval and cancel must go there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import ADMIN_TOKEN, SIM_MODEL, Server, query_rows, spawn_server
from tests.e2e.test_pools import Fleet, _wait, member

MEMBERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("responses"), sim_env=STORE, REQUIRE_API_KEY="true")
    try:
        for address in MEMBERS:
            fleet.start_sim(address)
        fleet.set_members(MEMBERS)
        fleet.start_gateway()
        wanted = {member(fleet, a) for a in MEMBERS}
        _wait(lambda: set(fleet.members()) == wanted, "three members")
        yield fleet
    finally:
        fleet.close()


def new_key(gateway: Server, name: str) -> str:
    with gateway.client(ADMIN_TOKEN) as admin:
        created = admin.post("/admin/v1/keys", json={"name": name})
    assert created.status_code == 201, created.text
    key: str = created.json()["key"]
    return key


@pytest.fixture(scope="module")
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    assert fleet.gateway is not None
    key = new_key(fleet.gateway, "conversations")
    with openai.OpenAI(base_url=f"{fleet.gateway.base_url}/v1", api_key=key) as sdk:
        _wait(lambda: _works(sdk), "the new key taken")
        yield sdk


def _works(sdk: openai.OpenAI) -> bool:
    with contextlib.suppress(openai.AuthenticationError):
        sdk.models.list()
        return True
    return False


def turn(
    sdk: openai.OpenAI, text: str, previous: str | None = None, **extra: object
) -> tuple[str, str]:
    """One turn: (response id, the member that served it)."""
    raw = sdk.responses.with_raw_response.create(
        model=SIM_MODEL, input=text, max_output_tokens=8, previous_response_id=previous
    )
    return raw.parse().id, raw.headers["x-draftgate-backend"]


def test_every_later_turn_goes_to_the_member_holding_the_conversation(
    client: openai.OpenAI, fleet: Fleet
) -> None:
    homes = set()
    for conversation in range(8):
        response_id, home = turn(client, f"conversation {conversation}: hello")
        homes.add(home)
        for later in range(4):
            response_id, served = turn(client, f"and then {later}", response_id)
            assert served == home, (conversation, later)
    assert len(homes) > 1  # conversations still spread over the members
    # each turn's ledger record keeps the id its member stored (written within the flush)
    stored = lambda: query_rows(  # noqa: E731
        fleet.database_url,
        "SELECT COUNT(*) AS n FROM usage_records WHERE response_id LIKE 'resp_%'",
    )[0]["n"]
    _wait(lambda: stored() >= 40, "every turn's response id recorded")


def test_a_streamed_turn_is_continued_where_it_was_stored(client: openai.OpenAI) -> None:
    with client.responses.with_streaming_response.create(
        model=SIM_MODEL, input="tell me something", max_output_tokens=8, stream=True
    ) as raw:
        home = raw.headers["x-draftgate-backend"]
        events = list(raw.parse())
    completed = events[-1]
    assert completed.type == "response.completed"
    _, served = turn(client, "go on", completed.response.id)
    assert served == home


def test_a_stored_response_is_retrieved_from_its_member_and_only_by_its_key(
    client: openai.OpenAI, fleet: Fleet
) -> None:
    response_id, home = turn(client, "remember this")
    retrieved = client.responses.with_raw_response.retrieve(response_id)
    assert retrieved.headers["x-draftgate-backend"] == home
    assert retrieved.parse().id == response_id
    assert retrieved.parse().output_text
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(response_id)  # the member's own answer, relayed
    assert fleet.gateway is not None
    other = new_key(fleet.gateway, "someone-else")
    with openai.OpenAI(base_url=client.base_url, api_key=other) as stranger:
        _wait(lambda: _works(stranger), "the second key taken")
        for attempt in (
            lambda: stranger.responses.retrieve(response_id),
            lambda: stranger.responses.cancel(response_id),
            lambda: turn(stranger, "what did they say?", response_id),
        ):
            with pytest.raises(openai.NotFoundError) as refused:
                attempt()
            assert refused.value.code == "response_not_found"
    for keyless in (
        httpx.get(f"{fleet.gateway.base_url}/v1/responses/{response_id}", timeout=10),
        httpx.post(f"{fleet.gateway.base_url}/v1/responses/{response_id}/cancel", timeout=10),
    ):
        assert keyless.status_code == 401, keyless.text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_neverstoredanywhere")
    with pytest.raises(openai.BadRequestError):
        turn(client, "hi", "not an id!")


def test_another_replica_finds_where_a_response_is_stored(
    client: openai.OpenAI, fleet: Fleet
) -> None:
    response_id, home = turn(client, "made on the first replica")
    second = spawn_server(("gateway",), fleet.env(), fleet.directory)
    try:
        second.wait_healthy()
        wanted = {member(fleet, a) for a in MEMBERS}
        ready = lambda: httpx.get(f"{second.base_url}/ready").json()["backends_healthy"]  # noqa: E731
        _wait(lambda: ready() == len(wanted), "the second replica ready")
        with openai.OpenAI(base_url=f"{second.base_url}/v1", api_key=client.api_key) as there:
            _, served = turn(there, "continued on the second", response_id)
            assert served == home
            assert there.responses.retrieve(response_id).id == response_id
    finally:
        second.close()


def test_a_turn_whose_member_left_is_told_its_state_is_gone(
    client: openai.OpenAI, fleet: Fleet
) -> None:
    response_id, home = turn(client, "a conversation on a member about to leave")
    gone = next(a for a in MEMBERS if member(fleet, a) == home)
    fleet.set_members([a for a in MEMBERS if a != gone])
    try:
        _wait(lambda: home not in fleet.members(), "the member removed")
        with pytest.raises(openai.NotFoundError) as refused:
            turn(client, "still there?", response_id)
        assert refused.value.code == "response_not_found"
        assert "no longer serves" in str(refused.value)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
        _, served = turn(client, "a new conversation")  # new ones are served as ever
        assert served != home
    finally:
        fleet.set_members(MEMBERS)
        _wait(lambda: home in fleet.members(), "the member back")
