"""The in-memory registry the hot path reads: a snapshot of the database, refreshed often.

The snapshot (backends, model policies, API keys, prices, throughput curves, key spend) is
rebuilt from the database every `registry_refresh_s` and at once after a change through this
replica's admin API. Per-backend runtime state (in-flight requests, health, circuit breaker,
scraped load) lives beside it and survives refreshes.
"""

# Over 400 lines: the views a request reads, the snapshot holding them and its loader change
# together (a field added to a view is read from the database here).

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from gateway.acceptance import Acceptance, ClassPrice, class_price
from gateway.context import Context
from gateway.curves import (
    Aggregate,
    Band,
    CurveKey,
    Prefill,
    Rejections,
    Sample,
    Served,
    Variant,
    build_curves,
    pool,
)
from gateway.db.measurements import usable
from gateway.db.tables import (
    ApiKey,
    Backend,
    GpuPrice,
    ModelPolicy,
    Quarantine,
    Team,
    UsageHourly,
)
from gateway.drafters import DrafterCurve, DrafterKey, drafter_curves
from gateway.policy.affinity import stable_hash
from gateway.policy.choices import Choices
from gateway.policy.classes import ClassView, compile_classes
from gateway.policy.moves import Move, stored_move
from gateway.policy.rules import RuleView, compile_rules
from gateway.policy.trials import DrafterTrial, stored_trial
from planner.cost import ThroughputCurve, usd_per_mtok

logger = logging.getLogger(__name__)
PRICE_KIND = "on-demand"  # the price that costs requests; others are what-ifs
# The speculation a class's price is read from: its last day of requests, whole hours
CLASS_ACCEPTANCE_WINDOW = dt.timedelta(hours=24)
MAX_STREAMS = 4096  # the most streams on one backend routing considers
LOAD_SMOOTHING = 0.25  # weight of each scrape in a backend's smoothed load (about 4 scrapes)


@dataclass(frozen=True, slots=True)
class BackendView:
    """A backend as routing sees it."""

    name: str
    url: str
    model: str
    method: str
    k: int | None
    gpu_type: str
    gpu_count: int
    api_key: str | None = field(default=None, repr=False)
    pool: str = ""  # the pool it is a member of; a backend without one is a pool of one
    drafter: str | None = None
    engine_version: str | None = None  # its `/version`, as the leader last read it
    priority_scheduling: bool = False  # its server takes vLLM's `priority` (schedules by it)
    seed: int = field(init=False, repr=False, compare=False)  # its rendezvous-hash seed

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", stable_hash(self.name.encode()))
        if not self.pool:
            object.__setattr__(self, "pool", self.name)

    def auth(self) -> dict[str, str]:
        """The headers every request to it carries: its key, if it has one."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True, slots=True)
class InFlightClock:
    """What a gateway sent one backend, cumulative: request-seconds in flight (their rate is
    the mean requests in flight), seconds with at least one in flight, requests ended."""

    in_flight_s: float = 0.0
    busy_s: float = 0.0
    ended: float = 0.0

    def since(self, earlier: InFlightClock) -> InFlightClock:
        """The change from `earlier` to this."""
        return InFlightClock(
            self.in_flight_s - earlier.in_flight_s,
            self.busy_s - earlier.busy_s,
            self.ended - earlier.ended,
        )


@dataclass(slots=True)
class BackendState:
    """What this replica knows about a backend right now."""

    in_flight: int = 0  # this process's requests on it (change it through `begin` and `end`)
    # Since this process started: Σ in_flight·dt (request-seconds in flight), the seconds
    # with at least one in flight, and requests ended, settled at each change and `clock` read.
    in_flight_s: float = 0.0
    busy_s: float = 0.0
    ended: int = 0
    settled_at: float | None = None  # the monotonic moment they were settled to
    healthy: bool = True
    slow_probes: int = 0  # health probes in a row that timed out
    failures: int = 0
    open_until: float = 0.0  # circuit breaker: no traffic before this (monotonic seconds)
    served_at: float = 0.0  # its last response head below 400 (monotonic seconds)
    waiting: float = 0.0  # scraped `num_requests_waiting`, when known
    kv_usage: float = 0.0  # scraped KV-cache usage, when known
    mismatch: str | None = None  # the scraped counters contradict the declared method
    # The context length its `/v1/models` reports: 0 when it reports none, None before asked.
    max_model_len: int | None = None
    # The engine version its `/version` reports: "" when it serves none, None before asked
    # (and again after a restart, which may have been an upgrade).
    engine_version: str | None = None
    # Mean acceptance length and per-position acceptance of the last scrape interval in
    # which the backend drafted; None for plain or before it drafted.
    acceptance_length: float | None = None
    acceptance_per_position: tuple[float, ...] | None = None
    # The backend's requests running or waiting, from every replica and client (its gauges
    # at each scrape), smoothed over the last few scrapes; None before the second scrape.
    scraped_running: float | None = None

    def begin(self, now: float) -> None:
        """One more request in flight from `now` (monotonic seconds)."""
        self.clock(now)
        self.in_flight += 1

    def end(self, now: float) -> None:
        """One request fewer in flight from `now`."""
        self.clock(now)
        self.in_flight -= 1
        self.ended += 1

    def clock(self, now: float) -> InFlightClock:
        """This process's in-flight clock of the backend, settled to `now`."""
        if self.settled_at is not None and self.in_flight > 0 and now > self.settled_at:
            elapsed = now - self.settled_at
            self.in_flight_s += self.in_flight * elapsed
            self.busy_s += elapsed
        self.settled_at = now
        return InFlightClock(self.in_flight_s, self.busy_s, self.ended)

    def available(self, now: float) -> bool:
        """Healthy and not held out by an open circuit breaker (`now` is monotonic)."""
        return self.healthy and self.open_until <= now

    def scraped(self, running: float) -> None:
        """The backend's requests in flight over the scrape interval that just ended."""
        if self.scraped_running is None:
            self.scraped_running = running
        else:
            self.scraped_running += LOAD_SMOOTHING * (running - self.scraped_running)

    def load(self) -> float:
        """Requests the backend is serving, from every replica: its smoothed scraped load,
        or, before any scrape, this replica's in flight. Every replica reads the same
        counters, so all price the same backend's tokens at the same load; a burst reaches
        the price within a scrape or two. (Adding this replica's own count between scrapes
        made replicas disagree: the one with burstier clients priced 5-10% higher.)"""
        if self.scraped_running is None:
            return float(self.in_flight)
        return max(self.scraped_running, min(self.in_flight, 1))  # a request runs with itself


@dataclass(frozen=True, slots=True)
class PolicyView:
    """A model's policy."""

    mode: str = "auto"
    method: str | None = None
    k: int | None = None
    explore_fraction: float = 0.0
    itl_objective_ms: float | None = None
    rules: tuple[RuleView, ...] = ()  # checked before the policy's own choice
    move: Move | None = None  # a gradual move to the pinned method (maybe already over)
    classes: Mapping[str, ClassView] = field(default_factory=dict)  # objectives for auto
    drafter_trial: DrafterTrial | None = None  # an A/B of two drafters of one method
    quarantined: frozenset[str] = frozenset()  # methods auto must not choose (lossless)


@dataclass(frozen=True, slots=True)
class KeyView:
    """An API key as the hot path checks it."""

    id: int
    name: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    budget_usd: float | None
    budget_period: str
    allowed_models: frozenset[str] | None
    max_concurrent_requests: int | None = None  # on each replica
    request_class: str | None = None  # its requests' class without a class header
    max_body_bytes: int | None = None  # its bodies' bound, under the gateway's
    lossless_opt_out: bool = False  # its requests are never replayed by the lossless watchdog
    team_id: int | None = None  # the team it belongs to (its allowed models are within its)
    # A team as its own caller, for requests a token (JWT) authenticated: its id is the team's
    # subject id (`team_subject`), so it reserves against the team's counters, and no key
    # is recorded for its requests.
    team_caller: bool = False

    @property
    def api_key_id(self) -> int | None:
        """The key its requests are recorded under: None for a team caller."""
        return None if self.team_caller else self.id


def by_method(backends: Iterable[BackendView]) -> dict[str, tuple[BackendView, ...]]:
    """Backends grouped by method, in their order."""
    groups: dict[str, list[BackendView]] = defaultdict(list)
    for b in backends:
        groups[b.method].append(b)
    return {method: tuple(group) for method, group in groups.items()}


@dataclass(frozen=True, slots=True)
class TeamShare:
    """A team's weight in a full model's fair-share queue, and its requests' priority."""

    weight: float = 1.0
    priority: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Everything routing, auth and costing need, as of one database read."""

    backends: Mapping[str, tuple[BackendView, ...]] = field(default_factory=dict)  # by model
    policies: Mapping[str, PolicyView] = field(default_factory=dict)
    keys: Mapping[str, KeyView] = field(default_factory=dict)  # by SHA-256 of the key
    prices: Mapping[str, float] = field(default_factory=dict)  # usd/GPU-hour by GPU type
    # One set of curves prices requests, drives `auto`, sizes the fleet and is drawn: the
    # lines, the pooled measured points each rests on (at its K), and what was kept out.
    curves: Mapping[CurveKey, ThroughputCurve] = field(default_factory=dict)
    measured: Mapping[CurveKey, tuple[Aggregate, ...]] = field(default_factory=dict)
    curve_k: Mapping[CurveKey, int] = field(default_factory=dict)
    bands: Mapping[CurveKey, Band] = field(default_factory=dict)
    prefill: Mapping[CurveKey, Prefill] = field(default_factory=dict)
    context: Mapping[CurveKey, Context] = field(default_factory=dict)  # gateway/context.py
    rejected: Rejections = field(default_factory=dict)
    # Each budgeted key's spend in its period, by key id; and each budgeted team's, by its
    # subject id (`team_subject`: below 0)
    key_spend_usd: Mapping[int, float] = field(default_factory=dict)
    # Each team as the limiter checks it, by team id: its limits under its subject id
    teams: Mapping[int, KeyView] = field(default_factory=dict)
    # Each team whose weight or priority is not the default, by team id (relay/fairshare.py)
    team_shares: Mapping[int, TeamShare] = field(default_factory=dict)
    # Every team as the caller of a token naming it, by team name (`team_caller` views)
    team_callers: Mapping[str, KeyView] = field(default_factory=dict)
    # By (model, method, request class): the class's price from its own acceptance, where it
    # has enough requests that reported their speculation (gateway/acceptance.py)
    class_prices: Mapping[tuple[str, str, str], ClassPrice] = field(default_factory=dict)
    # By (model, method, GPU type, drafter), where two drafters of a method serve: each
    # one's curve from its own windows, which prices its requests (gateway/drafters.py)
    drafters: Mapping[DrafterKey, DrafterCurve] = field(default_factory=dict)
    # Filled as routing asks: (model, method, GPU type, GPU count, objective) -> streams
    _within: dict[tuple[str, str, str, int, float], int] = field(
        default_factory=dict, repr=False, compare=False
    )

    @functools.cached_property
    def pools(self) -> Mapping[str, Mapping[str, tuple[BackendView, ...]]]:
        """Each model's backends by method (its method pools), built once per snapshot so
        routing one request reads only the pools it uses."""
        return {model: by_method(backends) for model, backends in self.backends.items()}

    def usd_per_mtok(self, model: str, method: str, backend: BackendView, c: float) -> float | None:
        """Capacity cost of `method` for `model` on this backend's GPUs at concurrency c."""
        curve = self.curves.get((model, method, backend.gpu_type))
        price = self.prices.get(backend.gpu_type)
        if curve is None or price is None:
            return None
        tps = curve.at(c) * backend.gpu_count  # curves are per GPU
        return usd_per_mtok(price, backend.gpu_count, tps)

    def prompt_usd_per_mtok(self, model: str, method: str, gpu_type: str) -> float | None:
        """What 1M prompt tokens cost to prefill on this GPU type (None: unpriced)."""
        prefill, price = self.prefill.get((model, method, gpu_type)), self.prices.get(gpu_type)
        if prefill is None or price is None:
            return None
        return prefill.s_per_token * price / 3600 * 1e6

    def output_usd_per_mtok(
        self, model: str, method: str, backend: BackendView, c: float
    ) -> float | None:
        """The $/1M output tokens at c with the curve's own prefill taken out (the prompt
        tokens its traffic had per output token, priced at the prefill cost): the output
        price when prompts are priced apart. Without a prefill model, the curve's price."""
        usd = self.usd_per_mtok(model, method, backend, c)
        prompt = self.prompt_usd_per_mtok(model, method, backend.gpu_type)
        prefill = self.prefill.get((model, method, backend.gpu_type))
        if usd is None or prompt is None or prefill is None:
            return usd
        return max(usd - prefill.prompt_per_output * prompt, 0.0)

    def curve_source(self, model: str, method: str, gpu_type: str, c: float) -> str | None:
        """ "measured" when c lies within the measured points of the curve, else "estimated"
        (None without a curve)."""
        band = self.bands.get((model, method, gpu_type))
        return None if band is None else band.source(c)

    def relative_95(self, model: str, method: str, gpu_type: str, c: float) -> float | None:
        """The relative 95% half-width of the curve's throughput, and so of its $/1M, at c."""
        band = self.bands.get((model, method, gpu_type))
        return None if band is None else band.relative_95(c)

    def itl_ms(self, model: str, method: str, backend: BackendView, c: float) -> float | None:
        """Mean time per output token a request sees at concurrency c (c over tokens/s)."""
        curve = self.curves.get((model, method, backend.gpu_type))
        return None if curve is None else 1000 * max(c, 1.0) / (curve.at(c) * backend.gpu_count)

    def streams_within(
        self, model: str, method: str, backend: BackendView, objective_ms: float
    ) -> int | None:
        """The most streams one backend of `method` serves within the ITL objective, by its
        curve (0: not even one; None: no curve). Worked out once per snapshot and backend
        shape, so routing reads a number."""
        key = (model, method, backend.gpu_type, backend.gpu_count, objective_ms)
        if key not in self._within:
            if (model, method, backend.gpu_type) not in self.curves:
                return None
            low, high = 0, MAX_STREAMS  # the ITL grows with the streams: bisect
            while low < high:
                mid = (low + high + 1) // 2
                itl = self.itl_ms(model, method, backend, mid)
                low, high = (
                    (mid, high) if itl is not None and itl <= objective_ms else (low, mid - 1)
                )
            self._within[key] = low
        return self._within[key]

    def planner_error(self) -> dict[str, float]:
        """The planner's mean error on each model's measured points: the mean over its
        curves that have two or more (models with none are left out)."""
        errors: dict[str, list[float]] = defaultdict(list)
        for (model, _, _), band in self.bands.items():
            if band.planner_error is not None:
                errors[model].append(band.planner_error)
        return {model: sum(e) / len(e) for model, e in errors.items()}

    def default_method(self, model: str) -> str | None:
        """What an `auto` model serves before the selector's first choice for it: plain
        where a backend serves it (the baseline), else the first method by name. Never
        from the measurements: a change of method is the selector's, and audited."""
        methods = {b.method for b in self.backends.get(model, ())}
        return "plain" if "plain" in methods else (min(methods) if methods else None)


def period_start(period: str, now: dt.datetime) -> dt.datetime | None:
    """When the budget period holding `now` began (UTC); None for a `total` budget."""
    if period == "daily":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "monthly":
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None  # total


def load_snapshot(
    session: Session, scrape_max_age_s: float | None = None, class_min_requests: int = 0
) -> Snapshot:
    """Read the registry's snapshot from the database (collector windows older than
    `scrape_max_age_s` no longer shape the curves; a request class is priced from its own
    acceptance once `class_min_requests` of its requests reported theirs, 0: never)."""
    backends: dict[str, list[BackendView]] = defaultdict(list)
    for b in session.scalars(select(Backend).where(Backend.enabled).order_by(Backend.name)):
        view = BackendView(
            b.name, b.url, b.model, b.method, b.k, b.gpu_type, b.gpu_count, b.api_key,
            b.pool or "", b.drafter, b.engine_version, b.scheduling == "priority",
        )  # fmt: skip
        backends[b.model].append(view)
    policies = _policies(session)
    keys, teams = _keys(session), _teams(session)
    prices = {
        p.gpu_type: p.usd_per_gpu_hour
        for p in session.scalars(select(GpuPrice).where(GpuPrice.kind == PRICE_KIND))
    }
    since = None
    if scrape_max_age_s is not None:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=scrape_max_age_s)
    live: dict[CurveKey, set[Variant]] = defaultdict(set)
    for v in (v for group in backends.values() for v in group):
        live[(v.model, v.method, v.gpu_type)].add((v.drafter, v.engine_version))
    samples = [Sample((r[0], r[1], r[2]), *r[3:]) for r in usable(session, since)]
    points, rejected = pool(samples, live)
    curves = build_curves(points, _served(backends))
    return Snapshot(
        backends={m: tuple(v) for m, v in backends.items()},
        policies=policies,
        keys=keys,
        prices=prices,
        curves=curves.lines,
        measured=curves.measured,
        curve_k=curves.k,
        bands=curves.bands,
        prefill=curves.prefill,
        context=curves.context,
        rejected=rejected,
        key_spend_usd=_key_spend(session, keys.values()) | _team_spend(session, teams.values()),
        teams=teams,
        team_shares=_team_shares(session),
        team_callers=_team_callers(session),
        class_prices=_class_prices(session, class_min_requests) if class_min_requests else {},
        drafters=drafter_curves(samples, live, curves.k),
    )


def _policies(session: Session) -> dict[str, PolicyView]:
    quarantined: dict[str, frozenset[str]] = {}
    active = select(Quarantine.model, Quarantine.method).where(Quarantine.lifted_at.is_(None))
    for model, method in session.execute(active):
        quarantined[model] = quarantined.get(model, frozenset()) | {method}
    return {
        m.name: PolicyView(
            m.mode,
            m.method,
            m.k,
            m.explore_fraction,
            m.itl_objective_ms,
            compile_rules(m.rules),
            stored_move(m.move, m.method) if m.mode == "pinned" else None,
            compile_classes(m.classes),
            stored_trial(m.drafter_trial),
            quarantined.get(m.name, frozenset()),
        )
        for m in session.scalars(select(ModelPolicy))
    }


KEY_COLUMNS = (
    ApiKey.key_hash, ApiKey.id, ApiKey.name, ApiKey.requests_per_minute,
    ApiKey.tokens_per_minute, ApiKey.budget_usd, ApiKey.budget_period, ApiKey.allowed_models,
    ApiKey.max_concurrent_requests, ApiKey.request_class, ApiKey.max_body_bytes,
    ApiKey.lossless_opt_out, ApiKey.team_id,
)  # fmt: skip


def _keys(session: Session) -> dict[str, KeyView]:
    """Every active key, read as rows (not ORM objects: a refresh reads every key, and with
    thousands of them building objects was most of its time)."""
    teams = {
        team_id: models for team_id, models in session.execute(select(Team.id, Team.allowed_models))
    }
    return {
        k.key_hash: KeyView(
            k.id,
            k.name,
            k.requests_per_minute,
            k.tokens_per_minute,
            k.budget_usd,
            k.budget_period,
            _allowed(k.allowed_models, teams.get(k.team_id or 0)),
            k.max_concurrent_requests,
            k.request_class,
            k.max_body_bytes,
            k.lossless_opt_out,
            k.team_id,
        )
        for k in session.execute(select(*KEY_COLUMNS).where(ApiKey.revoked_at.is_(None)))
    }


def team_subject(team_id: int) -> int:
    """A team's id among what the limiter counts: keys from 1 up, teams from -1 down."""
    return -team_id


def _team_shares(session: Session) -> dict[int, TeamShare]:
    """Each team whose weight or priority is not the default."""
    return {
        t.id: TeamShare(t.weight, t.priority)
        for t in session.scalars(select(Team).where((Team.weight != 1) | (Team.priority != 0)))
    }


def _teams(session: Session) -> dict[int, KeyView]:
    """Each team with a limit, as the limiter checks it (its subject id, its limits)."""
    return {
        t.id: KeyView(
            team_subject(t.id),
            t.name,
            t.requests_per_minute,
            t.tokens_per_minute,
            t.budget_usd,
            t.budget_period,
            None,
        )
        for t in session.scalars(select(Team))
        if t.budget_usd is not None or t.requests_per_minute or t.tokens_per_minute
    }


def _team_callers(session: Session) -> dict[str, KeyView]:
    """Every team as a token's caller, by name: its limits under its subject id (the same
    counters its keys' requests reserve against) and its allowed models."""
    return {
        t.name: KeyView(
            team_subject(t.id),
            t.name,
            t.requests_per_minute,
            t.tokens_per_minute,
            t.budget_usd,
            t.budget_period,
            None if t.allowed_models is None else frozenset(t.allowed_models),
            team_id=t.id,
            team_caller=True,
        )
        for t in session.scalars(select(Team))
    }


def _team_spend(session: Session, teams: Iterable[KeyView]) -> dict[int, float]:
    """USD each budgeted team's keys spent in its period, from the hourly rollups (by the
    team each request was served for), by the team's subject id (minus its own)."""
    budgeted = ((-t.id, t.budget_period) for t in teams if t.budget_usd is not None)
    spent = _period_spend(session, UsageHourly.team_id, budgeted)
    return {-team_id: usd for team_id, usd in spent.items()}


def _allowed(own: list[str] | None, theirs: list[str] | None) -> frozenset[str] | None:
    """The models a key may use: its own list within its team's (None: any)."""
    if own is None or theirs is None:
        either = own if theirs is None else theirs
        return None if either is None else frozenset(either)
    return frozenset(own).intersection(theirs)


def auto_method(
    snapshot: Snapshot, choices: Choices, model: str, request_class: str | None = None
) -> str | None:
    """The method an `auto` model uses now for `request_class`: the selector's choice for
    that class, else for the model, else the snapshot's."""
    return choices.method(model, request_class) or snapshot.default_method(model)


def _served(backends: Mapping[str, list[BackendView]]) -> list[Served]:
    """What the backends run, and plain on each (model, GPU type): the baseline every
    saving and right-sized fleet is measured against, predicted where it is not measured."""
    served = [
        Served(b.model, b.method, b.k or 0, b.gpu_type) for bs in backends.values() for b in bs
    ]
    baselines = {Served(b.model, "plain", 0, b.gpu_type) for bs in backends.values() for b in bs}
    return served + sorted(baselines - set(served), key=lambda s: (s.model, s.gpu_type))


def _class_prices(session: Session, min_requests: int) -> dict[tuple[str, str, str], ClassPrice]:
    """Each class's price factor per (model, method), from the speculation its requests
    reported over the last `CLASS_ACCEPTANCE_WINDOW`, against all of the method's requests
    over the same window (hourly rollups: the refresh never scans the records)."""
    h = UsageHourly
    since = dt.datetime.now(dt.UTC) - CLASS_ACCEPTANCE_WINDOW
    since = since.replace(minute=0, second=0, microsecond=0)  # its hourly rollup
    sums = [h.spec_requests, h.spec_steps, h.accepted_tokens, h.accepted_sq, h.accepted_steps,
            h.steps_sq]  # fmt: skip
    query = (
        select(h.model, h.method, h.request_class, *(func.sum(c) for c in sums))
        .where(h.hour >= since, h.spec_requests > 0)
        .group_by(h.model, h.method, h.request_class)
    )
    by_class: dict[tuple[str, str, str], Acceptance] = {}
    for model, method, request_class, n, *rest in session.execute(query):
        by_class[(model, method, request_class)] = Acceptance(int(n), *(float(v) for v in rest))
    by_method: dict[tuple[str, str], Acceptance] = defaultdict(Acceptance)
    for (model, method, _), acceptance in by_class.items():
        by_method[(model, method)] += acceptance
    prices = {
        key: class_price(acceptance, by_method[key[:2]], min_requests)
        for key, acceptance in by_class.items()
        if key[2]  # records refused before their class was known are in the method's only
    }
    return {key: price for key, price in prices.items() if price is not None}


def _key_spend(session: Session, keys: Iterable[KeyView]) -> dict[int, float]:
    """USD each budgeted key spent in its current period, from the hourly rollups."""
    budgeted = ((k.id, k.budget_period) for k in keys if k.budget_usd is not None)
    return _period_spend(session, UsageHourly.api_key_id, budgeted)


def _period_spend(
    session: Session, column: InstrumentedAttribute[int], subjects: Iterable[tuple[int, str]]
) -> dict[int, float]:
    """USD spent in each (id, budget period)'s current period, from the hourly rollups, by
    its id in `column`: one query per period.

    Periods start on UTC hour boundaries (midnight, the 1st), so the rollups are exact here
    and the refresh never scans raw usage records.
    """
    now = dt.datetime.now(dt.UTC)
    by_period: dict[str, list[int]] = defaultdict(list)
    for subject, period in subjects:
        by_period[period].append(subject)
    spend: dict[int, float] = {}
    for period, ids in by_period.items():
        query = (
            select(column, func.coalesce(func.sum(UsageHourly.cost_usd), 0.0))
            .where(column.in_(ids))
            .group_by(column)
        )
        start = period_start(period, now)
        if start is not None:
            query = query.where(UsageHourly.hour >= start)
        spend.update({int(s): float(total or 0.0) for s, total in session.execute(query) if s})
    return spend


class Registry:
    """The current snapshot plus per-backend state; refreshed in the background."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        refresh_s: float,
        scrape_max_age_s: float | None = None,
        class_min_requests: int = 0,
    ) -> None:
        self.snapshot = Snapshot()
        self.states: dict[str, BackendState] = defaultdict(BackendState)
        self._sessions = sessions
        self._refresh_s = refresh_s
        self._scrape_max_age_s = scrape_max_age_s
        self._class_min_requests = class_min_requests
        self._wake = asyncio.Event()
        self._load_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_load_start: list[Callable[[], None]] = []  # told before each read
        self.on_load: list[Callable[[], None]] = []  # told when a fresh snapshot is in place
        # The selector's choices, published whole (gateway/policy/choices.py)
        self.choices = Choices()

    def load(self) -> None:
        """Replace the snapshot with a fresh read (blocking; call from a thread).

        Loads run one at a time, so a read that began before a change can never replace
        the snapshot of a read that began after it.
        """
        with self._load_lock:
            for callback in self.on_load_start:
                callback()
            with self._sessions() as session:
                snapshot = load_snapshot(session, self._scrape_max_age_s, self._class_min_requests)
            self.snapshot = snapshot
            for callback in self.on_load:
                callback()

    def request_refresh(self) -> None:
        """Ask for a reload soon; safe from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def wake(self) -> None:
        """Wake the refresh loop (to notice a stop)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Reload on an interval or when asked, until `stop`; a failed reload keeps the last."""
        self._loop = asyncio.get_running_loop()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._refresh_s)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                await asyncio.to_thread(self.load)
            except SQLAlchemyError as exc:
                logger.warning("registry refresh failed, keeping the last snapshot: %s", exc)
