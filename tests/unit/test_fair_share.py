"""The fair-share queue on its own: room by the curve within the objective, who goes in next
(priority, then the team served the fewest tokens for its weight), and the 429s."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, BackendView, PolicyView, Snapshot, TeamShare
from gateway.relay.fairshare import FairShare, QueueFull, QueueTimeout, Ticket, capacity
from planner.cost import ThroughputCurve

PLAIN = BackendView("a", "http://a", "m", "plain", None, "B200", 1)
# 100 tokens/s whatever the load: the ITL is 10 ms per stream, so 20 ms leaves room for 2
SNAPSHOT = Snapshot(
    backends={"m": (PLAIN,)},
    policies={"m": PolicyView("pinned", "plain", itl_objective_ms=20.0)},
    curves={("m", "plain", "B200"): ThroughputCurve((1.0, 64.0), (100.0, 100.0))},
    team_shares={2: TeamShare(weight=2.0), 3: TeamShare(priority=-1)},
)
LONG, SHORT = 8000, 20


class Watch:
    """The client never leaves."""

    def arm(self) -> None:
        pass

    def disarm(self) -> None:
        pass


def fair(timeout_s: float = 30.0, max_queue: int = 100) -> FairShare:
    return FairShare(defaultdict(BackendState), GatewayMetrics(), max_queue, timeout_s)


async def enter(share: FairShare, team: int, prompt: int, priority: int = 0) -> Ticket:
    return await share.enter(SNAPSHOT, "m", team, priority, lambda: prompt, Watch())


async def settle() -> None:
    for _ in range(5):  # the let-in waiters' tasks run
        await asyncio.sleep(0)


def test_room_is_the_streams_within_the_objective_and_nothing_waits_within_it() -> None:
    states: defaultdict[str, BackendState] = defaultdict(BackendState)
    assert capacity(SNAPSHOT, "m", states, 0.0) == 2
    states["a"].waiting = 3.0  # the engine queues: no room until a scrape says otherwise
    assert capacity(SNAPSHOT, "m", states, 0.0) == 0
    unbounded = Snapshot(backends={"m": (PLAIN,)}, curves=SNAPSHOT.curves)
    assert capacity(unbounded, "m", defaultdict(BackendState), 0.0) is None  # no objective

    async def run() -> None:
        share = fair()
        first, second = await enter(share, -1, SHORT), await enter(share, -1, SHORT)
        assert share.gates["m"].inside == 2
        assert first.share is None  # no contention: no one was charged
        third = asyncio.ensure_future(enter(share, -1, SHORT))
        await settle()
        assert not third.done()
        assert share.gates["m"].queued == 1
        first.done()
        first.done()  # once, whoever calls it
        await settle()
        assert third.done()
        assert share.gates["m"].inside == 2
        second.done()
        third.result().done()
        assert share.gates["m"].inside == 0

    asyncio.run(run())


def let_in_order(waiters: list[tuple[int, int, int]]) -> list[int]:
    """With the backend full, (team, prompt, priority) waiters queued in order; the teams
    in the order they are let in, one request at a time."""

    async def run() -> list[int]:
        share = fair()
        held = [await enter(share, 0, SHORT), await enter(share, 0, SHORT)]
        let_in: list[tuple[int, asyncio.Task[Ticket]]] = []
        for team, prompt, priority in waiters:
            task = asyncio.ensure_future(enter(share, team, prompt, priority))
            task.add_done_callback(lambda done, team=team: let_in.append((team, done)))
            await settle()
        taken = 0
        while held:  # one request done at a time: one let in
            held.pop(0).done()
            await settle()
            held.extend(task.result() for _, task in let_in[taken:])
            taken = len(let_in)
        return [team for team, _ in let_in]

    return asyncio.run(run())


def test_a_team_of_long_prompts_waits_while_a_team_of_short_ones_catches_up() -> None:
    # team -1 sends 8000-token prompts, team -4 20-token ones (each charged 256 completion)
    waiters = [(-1, LONG, 0)] * 3 + [(-4, SHORT, 0)] * 40
    order = let_in_order(waiters)
    assert order[0] == -1  # the first in line went first: no counter yet
    # then the short team, until its tokens reach the long team's 8256: 30 of 276
    assert order[1:31] == [-4] * 30
    assert order[31] == -1


def test_a_team_of_weight_two_is_served_twice_the_tokens() -> None:
    waiters = [(-2, SHORT, 0)] * 30 + [(-4, SHORT, 0)] * 30  # team 2 has weight 2
    order = let_in_order(waiters)
    first_21 = order[:21]
    assert first_21.count(-2) == 14  # 2 of every 3
    assert first_21.count(-4) == 7


def test_a_higher_priority_goes_first_whatever_its_team_was_served() -> None:
    waiters = [(-4, SHORT, 0)] * 3 + [(-3, LONG, -1)] * 3
    assert let_in_order(waiters) == [-3, -3, -3, -4, -4, -4]


def test_a_full_queue_and_a_long_wait_are_429s_that_leave_nothing_queued() -> None:
    async def run() -> None:
        share = fair(timeout_s=0.3, max_queue=1)
        await enter(share, -1, SHORT)
        await enter(share, -1, SHORT)
        waiting = asyncio.ensure_future(enter(share, -1, SHORT))
        await settle()
        with pytest.raises(QueueFull) as full:
            await enter(share, -1, SHORT)
        assert (full.value.status_code, full.value.code) == (429, "queue_full")
        assert full.value.retry_after_s == 1
        with pytest.raises(QueueTimeout) as late:
            await waiting
        assert (late.value.status_code, late.value.code) == (429, "queue_timeout")
        assert late.value.retry_after_s is not None
        gate = share.gates["m"]
        assert (gate.queued, gate.inside) == (0, 2)
        refusals = share.metrics.registry.get_sample_value(
            "draftgate_fair_queue_refusals_total", {"model": "m", "reason": "queue_timeout"}
        )
        assert refusals == 1

    asyncio.run(run())


def test_a_client_that_leaves_while_it_waits_is_taken_out_of_the_queue() -> None:
    async def run() -> None:
        share = fair()
        held = await enter(share, -1, SHORT)
        await enter(share, -1, SHORT)
        leaving = asyncio.ensure_future(enter(share, -4, SHORT))
        staying = asyncio.ensure_future(enter(share, -5, SHORT))
        await settle()
        leaving.cancel()
        await settle()
        assert share.gates["m"].queued == 1
        held.done()
        await settle()
        assert staying.done()
        assert share.gates["m"].inside == 2

    asyncio.run(run())


def test_a_teams_urgent_request_does_not_wait_behind_its_own_batch() -> None:
    async def run() -> None:
        share = fair()
        held = await enter(share, -4, SHORT)
        await enter(share, -4, SHORT)
        batch = asyncio.ensure_future(enter(share, -4, SHORT, priority=1))
        await settle()
        urgent = asyncio.ensure_future(enter(share, -4, SHORT, priority=-1))
        await settle()
        held.done()
        await settle()
        assert urgent.done()
        assert not batch.done()
        urgent.result().done()
        await settle()
        assert batch.done()

    asyncio.run(run())


def test_a_pinned_models_room_is_its_methods_backends_alone() -> None:
    eagle = BackendView("e", "http://e", "m", "eagle3", 3, "B200", 1)
    curve = SNAPSHOT.curves[("m", "plain", "B200")]
    curves = {("m", "plain", "B200"): curve, ("m", "eagle3", "B200"): curve}
    states: defaultdict[str, BackendState] = defaultdict(BackendState)
    pinned = PolicyView("pinned", "plain", itl_objective_ms=20.0)
    both = Snapshot(backends={"m": (PLAIN, eagle)}, policies={"m": pinned}, curves=curves)
    assert capacity(both, "m", states, 0.0) == 2
    auto = PolicyView("auto", itl_objective_ms=20.0)  # past one method's room, it spills
    both = Snapshot(backends={"m": (PLAIN, eagle)}, policies={"m": auto}, curves=curves)
    assert capacity(both, "m", states, 0.0) == 4
