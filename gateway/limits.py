"""Per-key limits: requests and tokens per minute, and a USD budget, across replicas;
requests in flight at once, on each replica. A team's are checked alike after its key's
(docs/teams.md), as one more subject, under its id below 0.

Checks read memory only. A request is admitted with a *reservation*: its worst-case tokens
(the prompt's estimate plus every completion token it may ask for) and cost, counted at once,
then settled to the actual when it ends (or released, when it fails). Checks on one replica
therefore see every request it has in flight at its worst case: concurrent requests cannot
overshoot a limit together, and a single request larger than what remains is refused.

Each replica counts its own requests and tokens per key and minute (reservations included),
and every `limits_sync_s` adds its new counts to the shared `rate_windows` table and reads
back the totals of all replicas. A token or request limit therefore holds across replicas to
within one sync interval of the other replicas' admissions.

Budgets compare the key's spend in its period (from the registry's snapshot of the ledger),
plus what was served that the snapshot does not include yet, plus the reservations in
flight. A replica's worker processes share those figures (gateway/server/shared_budget.py), so a
budget holds over all of one replica's workers as in one process. Other replicas'
reservations are not shared: a replica sees another's spend only once that request has
ended, its ledger has written it (`ledger_flush_interval_s`, 0.5 s by default) and this
replica's registry has read it (`registry_refresh_s`, 2 s). Until then each of N replicas
may admit the whole budget that remained, so a budget can be overshot by at most N - 1
times what remained: with 3 replicas and $10 left, up to $30 admitted, $20 over.

A key's requests in flight are counted on each replica alone (from admission to settlement),
over all of its worker processes (gateway/server/inflight.py): `max_concurrent_requests` bounds what
one client holds of one replica (its upstream connections, its streams), as nginx's
`limit_conn` does, not across the fleet.
"""

# Over 400 lines: one limiter, its keys' and teams' checks, reservations and their sharing
# across workers and replicas, read as one.

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.session import transaction, upsert_insert
from gateway.db.tables import RateWindow
from gateway.errors import QuotaExceeded, RateLimited
from gateway.registry import KeyView, Snapshot
from gateway.server.inflight import SharedInFlight
from gateway.server.shared_budget import SharedBudgets

logger = logging.getLogger(__name__)
WINDOW_S = 60


@dataclass(slots=True)
class _Counts:
    """One key's counts in one minute."""

    shared_requests: int = 0  # all replicas, as of the last sync (ours included)
    shared_tokens: int = 0
    unsynced_requests: int = 0  # ours since the last sync
    unsynced_tokens: int = 0
    pushing_requests: int = 0  # ours being written right now (not yet in the totals)
    pushing_tokens: int = 0

    @property
    def requests(self) -> int:
        return self.shared_requests + self.unsynced_requests + self.pushing_requests

    @property
    def tokens(self) -> int:
        return self.shared_tokens + self.unsynced_tokens + self.pushing_tokens


@dataclass(frozen=True, slots=True)
class Reservation:
    """What an admitted request holds against its key until it is settled."""

    key_id: int
    window: int  # the minute it was admitted in: its tokens count there
    tokens: int
    usd: float
    shared: bool = False  # counted in flight over the replica's workers (server/inflight.py)
    shared_budget: bool = False  # held over the replica's workers (gateway/server/shared_budget.py)


def budgeted_spend(snapshot: Snapshot) -> dict[int, float]:
    """Each budgeted key's and team's spend in its period, as of `snapshot`, by subject id
    (a key's id; a team's, below 0)."""
    spend = snapshot.key_spend_usd
    subjects = [*snapshot.keys.values(), *snapshot.teams.values()]
    return {k.id: spend.get(k.id, 0.0) for k in subjects if k.budget_usd is not None}


def current_window(now_s: float) -> int:
    """The unix minute a moment falls in."""
    return int(now_s // WINDOW_S)


class Limiter:
    """Counts per key and minute, and the checks against a key's limits."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        sync_s: float,
        shared: SharedInFlight | None = None,
        budgets: SharedBudgets | None = None,
    ) -> None:
        self._sessions = sessions
        self._sync_s = sync_s
        self._shared = shared  # with worker processes: in-flight counts over all of them
        self._budgets = budgets  # and budget figures over all of them
        self._budgeted: frozenset[int] = frozenset()  # key ids with a budget, as last loaded
        self._counts: dict[tuple[int, int], _Counts] = defaultdict(_Counts)
        self._spend_since_snapshot: dict[int, float] = defaultdict(float)
        self._reserved_usd: dict[int, float] = {}  # budget held by requests in flight
        self._in_flight: dict[int, int] = {}  # requests admitted and not yet settled, per key
        self._unwritten_at_start: dict[int, float] = {}  # as of the registry read under way
        self._spend_at_start: dict[int, float] | None = None

    def admit(
        self, key: KeyView, spent_usd: float, tokens: int, usd: float, now_s: float | None = None
    ) -> Reservation:
        """Reserve `tokens` and `usd` for one request, or raise the refusal over the key's
        rate limits or budget (`spent_usd`: the key's spend as of the registry's snapshot).
        A key's requests in flight and budget are counted over the replica's workers when it
        has them."""
        shared = self._shared
        if key.max_concurrent_requests is None or shared is None or not shared.covers(key.id):
            shared = None
        budgets = self._budgets
        if key.budget_usd is None or budgets is None or not budgets.covers(key.id):
            budgets = None
        if shared is None and budgets is None:
            in_flight = self._in_flight.get(key.id, 0)
            return self._admit(key, spent_usd, tokens, usd, now_s, in_flight, None)
        # No other worker admits between the checks and the counts. In-flight counts are
        # locked first, then budgets: one order everywhere.
        with contextlib.ExitStack() as locks:
            if shared is not None:
                locks.enter_context(shared.locked())
            if budgets is not None:
                locks.enter_context(budgets.locked())
            in_flight = self._in_flight.get(key.id, 0) if shared is None else shared.total(key.id)
            held = self._admit(key, spent_usd, tokens, usd, now_s, in_flight, budgets)
            if shared is not None:
                shared.add(key.id, 1)
        return replace(held, shared=shared is not None, shared_budget=budgets is not None)

    def _admit(
        self,
        key: KeyView,
        spent_usd: float,
        tokens: int,
        usd: float,
        now_s: float | None,
        in_flight: int,
        budgets: SharedBudgets | None,
    ) -> Reservation:
        most = key.max_concurrent_requests
        if most is not None and in_flight >= most:
            message = f"Concurrency limit reached: {most} requests in flight on this key"
            raise RateLimited(message, code="concurrency_limit_exceeded", retry_after_s=1)
        now_s = time.time() if now_s is None else now_s
        window = current_window(now_s)
        counts = self._counts.get((key.id, window), _Counts())
        retry = WINDOW_S - int(now_s % WINDOW_S)
        if key.requests_per_minute is not None and counts.requests >= key.requests_per_minute:
            message = f"Rate limit reached: {key.requests_per_minute} requests per minute"
            raise RateLimited(message, retry_after_s=retry)
        tpm = key.tokens_per_minute
        if tpm is not None and tokens > tpm:
            message = (
                f"Request too large: up to {tokens} tokens (prompt estimate plus max tokens), "
                f"over the key's limit of {tpm} tokens per minute; lower max_tokens"
            )
            raise RateLimited(message, param="max_tokens")
        if tpm is not None and counts.tokens + tokens > tpm:
            message = (
                f"Rate limit reached: {tpm} tokens per minute "
                f"({counts.tokens} used or reserved, this request up to {tokens})"
            )
            raise RateLimited(message, retry_after_s=retry)
        if key.budget_usd is not None:
            self._hold_budget(key, key.budget_usd, spent_usd, usd, budgets)
        counted = self._counts[(key.id, window)]
        counted.unsynced_requests += 1
        counted.unsynced_tokens += tokens
        self._in_flight[key.id] = self._in_flight.get(key.id, 0) + 1
        return Reservation(key.id, window, tokens, usd if key.budget_usd is not None else 0.0)

    def _hold_budget(
        self,
        key: KeyView,
        budget: float,
        spent_usd: float,
        usd: float,
        budgets: SharedBudgets | None,
    ) -> None:
        """Reserve `usd` of the key's budget, or refuse: its spend and what requests in
        flight hold, on every worker when `budgets` shares them (called under its lock)."""
        since = self._spend_since_snapshot.get(key.id, 0.0)
        held_here = self._reserved_usd.get(key.id, 0.0)
        if budgets is None:
            spent, held = spent_usd + since, held_here
        else:  # the newest worker's snapshot, and what each served since its own
            figures = budgets.figures(key.id)
            spent = max(spent_usd, figures.snapshot_usd) + figures.unsnapshotted_usd
            held = figures.reserved_usd
        if spent >= budget or spent + held + usd > budget:
            message = (
                f"Budget exhausted: ${spent:.4f} spent and ${held:.4f} held by requests "
                f"in flight of ${budget:.4f} ({key.budget_period}); this request may "
                f"cost up to ${usd:.4f}"
            )
            raise QuotaExceeded(message)
        self._reserved_usd[key.id] = held_here + usd
        if budgets is not None:
            budgets.write(key.id, held_here + usd, since)

    def budget_used(
        self, snapshot: Snapshot, named: bool = True, teams: bool = False
    ) -> dict[tuple[str, ...], float]:
        """The share of its budget each budgeted key (team) spent in its period, as its checks
        see it (reservations in flight aside), by (id, name: `key <id>` unless `named`)."""
        kind, subjects = ("team", snapshot.teams) if teams else ("key", snapshot.keys)
        budgeted = [(k, k.budget_usd) for k in subjects.values() if k.budget_usd]
        budgets = self._budgets
        if budgets is not None and not any(budgets.covers(k.id) for k, _ in budgeted):
            budgets = None  # no other worker's figures to read: no lock to take
        with contextlib.nullcontext() if budgets is None else budgets.locked():
            return {
                (str(abs(k.id)), k.name if named else f"{kind} {abs(k.id)}"): self._spent(
                    k.id, snapshot, budgets
                )
                / budget
                for k, budget in budgeted
            }

    def _spent(self, key_id: int, snapshot: Snapshot, budgets: SharedBudgets | None) -> float:
        """A key's spend as its checks see it (over every worker with `budgets`, locked)."""
        spent = snapshot.key_spend_usd.get(key_id, 0.0)
        if budgets is None or not budgets.covers(key_id):
            return spent + self._spend_since_snapshot.get(key_id, 0.0)
        figures = budgets.figures(key_id)
        return max(spent, figures.snapshot_usd) + figures.unsnapshotted_usd

    def settle(self, held: Reservation, tokens: int, cost_usd: float | None) -> None:
        """A request ended: its actual tokens and cost replace its reservation."""
        if held.shared and self._shared is not None:
            self._shared.add(held.key_id, -1)
        left_in_flight = self._in_flight.get(held.key_id, 0) - 1
        if left_in_flight > 0:
            self._in_flight[held.key_id] = left_in_flight
        else:
            self._in_flight.pop(held.key_id, None)
        if tokens != held.tokens and held.window >= current_window(time.time()) - 1:
            self._counts[(held.key_id, held.window)].unsynced_tokens += tokens - held.tokens
        budgets = self._budgets  # its figures shared if it holds some or has a budget now
        if budgets is None or not (
            held.shared_budget or (cost_usd and held.key_id in self._budgeted)
        ):
            self._settle_usd(held, cost_usd)
            return
        with budgets.locked():  # the cost counted and the reservation released at once
            self._settle_usd(held, cost_usd)
            since = self._spend_since_snapshot.get(held.key_id, 0.0)
            budgets.write(held.key_id, self._reserved_usd.get(held.key_id, 0.0), since)

    def _settle_usd(self, held: Reservation, cost_usd: float | None) -> None:
        """Release the request's reserved USD and count what it cost."""
        if held.usd:
            left = self._reserved_usd.get(held.key_id, 0.0) - held.usd
            if left > 1e-12:
                self._reserved_usd[held.key_id] = left
            else:
                self._reserved_usd.pop(held.key_id, None)
        if cost_usd:
            self._spend_since_snapshot[held.key_id] += cost_usd

    def release(self, held: Reservation) -> None:
        """Undo an admission its team then refused: as if its request never came."""
        self.settle(held, 0, None)
        if (counts := self._counts.get((held.key_id, held.window))) is not None:
            counts.unsynced_requests -= 1

    def remaining(self, key: KeyView, now_s: float | None = None) -> tuple[int | None, int | None]:
        """The key's requests and tokens left this minute (None: no such limit)."""
        counts = self._counts.get((key.id, current_window(time.time() if now_s is None else now_s)))
        counts = counts or _Counts()
        rpm, tpm = key.requests_per_minute, key.tokens_per_minute
        return (
            None if rpm is None else max(rpm - counts.requests, 0),
            None if tpm is None else max(tpm - counts.tokens, 0),
        )

    def snapshot_starting(self, unwritten_usd: Mapping[int, float]) -> None:
        """A registry read begins; `unwritten_usd` is the spend of records not yet written.

        The read's totals cannot include those records (the ledger may be holding them
        through a database outage), nor what is served while it runs: both stay counted.
        """
        self._unwritten_at_start = dict(unwritten_usd)
        self._spend_at_start = dict(self._spend_since_snapshot)

    def snapshot_loaded(self, snapshot: Snapshot) -> None:
        """The registry read `snapshot`, with fresh spend totals: forget what they now
        include (and, with worker processes, publish the budgeted keys' figures at once)."""
        budgets, spend_now = self._budgets, {}
        if budgets is not None:
            spend_now = {k: usd for k, usd in budgeted_spend(snapshot).items() if budgets.covers(k)}
        if budgets is None or not spend_now:  # no other worker reads anything of ours
            self._forget_snapshotted()
            self._budgeted = frozenset()
            return
        with budgets.locked():
            since = self._forget_snapshotted()
            for key_id in spend_now:
                budgets.write(key_id, self._reserved_usd.get(key_id, 0.0), since.get(key_id, 0.0))
            budgets.publish_snapshot(spend_now)
            self._budgeted = frozenset(spend_now)

    def _forget_snapshotted(self) -> Mapping[int, float]:
        """Keep, of the spend since the last snapshot, only what the new one cannot include:
        what was unwritten when its read began, and what was served during the read."""
        before = dict(self._spend_since_snapshot)  # one step: the loop may add a key
        spend = defaultdict(float, self._unwritten_at_start)
        if self._spend_at_start is not None:  # else: the read began after all we counted
            for key_id, usd in before.items():
                spend[key_id] += max(0.0, usd - self._spend_at_start.get(key_id, 0.0))
        self._spend_since_snapshot = spend
        self._unwritten_at_start, self._spend_at_start = {}, None
        return spend

    async def run(self, stop: asyncio.Event) -> None:
        """Exchange counts with the other replicas until `stop`."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._sync_s)
            if not stop.is_set():
                await self.sync()

    async def sync(self) -> None:
        """Add our new counts to the shared table and read back every replica's totals.

        Counts are taken and applied on the event loop; only the database work runs in a
        thread, so the hot path's increments are never raced.
        """
        window = current_window(time.time())
        for key in [k for k in self._counts if k[1] < window - 1]:
            del self._counts[key]  # older minutes no longer matter
        pushed = {
            key: (c.unsynced_requests, c.unsynced_tokens)
            for key, c in self._counts.items()
            if c.unsynced_requests or c.unsynced_tokens
        }
        for key, (requests, tokens) in pushed.items():
            counts = self._counts[key]
            counts.unsynced_requests -= requests
            counts.unsynced_tokens -= tokens
            counts.pushing_requests, counts.pushing_tokens = requests, tokens
        try:
            totals = await asyncio.to_thread(self._exchange, pushed, window - 1)
        except SQLAlchemyError as exc:
            logger.warning("rate-limit counts not shared this round: %s", exc)
            totals = {}
            for key, (requests, tokens) in pushed.items():  # keep them for the next round
                self._counts[key].unsynced_requests += requests
                self._counts[key].unsynced_tokens += tokens
        for key in pushed:
            self._counts[key].pushing_requests = self._counts[key].pushing_tokens = 0
        for key, (requests, tokens) in totals.items():
            if key in self._counts:
                self._counts[key].shared_requests = requests
                self._counts[key].shared_tokens = tokens

    def _exchange(
        self, pushed: dict[tuple[int, int], tuple[int, int]], since_window: int
    ) -> dict[tuple[int, int], tuple[int, int]]:
        """Upsert-increment our counts, then read all replicas' totals (in a thread)."""
        with transaction(self._sessions) as session:
            if pushed:
                statement = upsert_insert(session, RateWindow)
                statement = statement.on_conflict_do_update(
                    index_elements=["api_key_id", "window_start"],
                    set_={
                        "requests": RateWindow.requests + statement.excluded.requests,
                        "tokens": RateWindow.tokens + statement.excluded.tokens,
                    },
                )
                rows = [
                    {"api_key_id": k, "window_start": w, "requests": r, "tokens": t}
                    for (k, w), (r, t) in pushed.items()
                ]
                session.execute(statement, rows)
            query = select(RateWindow).where(RateWindow.window_start >= since_window)
            return {
                (r.api_key_id, r.window_start): (r.requests, r.tokens)
                for r in session.scalars(query)
            }
