"""Every Prometheus metric the gateway exposes, declared once, in one registry per app.

Labels are bounded: model and method come from the registry (not from clients), status is
an HTTP status class, backend names from the registry. Keys label only the budget gauge (the
keys with a budget, set on each registry refresh); no per-request label.

Gauges the alerting rules read (deploy/compose/alerts.yml) are set by control loops and the
registry refresh, never per request.

With worker processes (gateway/server/replica.py), every worker's counters and histograms, and the
gauges each worker holds its own share of (`SUMMED_GAUGES`: in flight, ledger pending), go
through prometheus-client's multiprocess files and are summed; a dead worker's counts stay
in its files, so totals never go backwards. Every other gauge is the replica's, set by the
leader: every worker exports the leader's values (`leader_gauges`), never the files' copies,
so a series the leader removes is gone from every worker's `/metrics`.
"""

# Over 400 lines: every metric the gateway exposes, declared once, in one place.

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.registry import InFlightClock
from gateway.server.private import read_private

# Every per-backend series: the backend, and the pool it is a member of (its own name for a
# backend declared by URL: a pool of one), so dashboards can sum a pool's members.
BACKEND = ["backend", "pool"]
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)


Series = TypeVar("Series", Counter, Histogram)

# Gauges each worker holds a share of, summed over the live workers; every other gauge is
# the replica's (the leader's).
SUMMED_GAUGES = frozenset(
    {"draftgate_backend_in_flight", "draftgate_ledger_pending", "draftgate_fair_queue_waiting"}
)


class _Families:
    """Metric families to render, as a registry would give them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class GatewayMetrics:
    """The gateway's metrics; `multiprocess_dir` names the workers' shared files, if any."""

    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.leader_gauges_file: Path | None = None  # where another worker's leader puts them
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._series: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        self._requests(r)
        self._routing(r)
        self._lossless(r)
        self._fair_share(r)
        self._backends(r)
        self._pricing(r)
        self._replica(r)
        self._ledger_queue(r)
        self._webhooks(r)
        self._records(r)

    def _requests(self, r: CollectorRegistry) -> None:
        """Requests on /v1: counts, latencies, tokens and their cost."""
        self.requests = Counter(
            "draftgate_requests",
            "Requests on /v1 by model, method and status class.",
            ["model", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "draftgate_request_latency_seconds",
            "End-to-end latency of /v1 requests.",
            ["model", "method"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft = Histogram(
            "draftgate_time_to_first_token_seconds",
            "Time to the first streamed byte of a completion.",
            ["model", "method"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "draftgate_inter_token_latency_seconds",
            "Mean time between streamed chunks of a completion.",
            ["model", "method"],
            buckets=ITL_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "draftgate_tokens",
            "Tokens by model, method and kind (prompt, completion).",
            ["model", "method", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "draftgate_cost_usd",
            "GPU-hour cost of served tokens, at the measured throughput.",
            ["model", "method"],
            registry=r,
        )
        # Savings (baseline minus cost) can be negative, which a counter cannot express:
        # the baseline is its own counter, savings = baseline_cost - cost in PromQL.
        self.baseline_cost = Counter(
            "draftgate_baseline_cost_usd",
            "GPU-hour cost the same tokens would have had with plain decoding.",
            ["model", "method"],
            registry=r,
        )

    def _routing(self, r: CollectorRegistry) -> None:
        """How requests were routed: fallbacks, panics, rules, affinity, retries, refusals."""
        self.fallbacks = Counter(
            "draftgate_fallbacks",
            "Requests served by another method than the policy's.",
            ["model", "reason"],
            registry=r,
        )
        self.panic_routes = Counter(
            "draftgate_panic_routes",
            "Requests of a model none of whose backends looked healthy: every one was tried.",
            ["model"],
            registry=r,
        )
        self.poison_requests = Counter(
            "draftgate_poison_requests",
            "Requests two backends answered with a 5xx alike: the request's fault, not "
            "retried further and not counted against any backend's breaker.",
            ["model"],
            registry=r,
        )
        self.rule_matches = Counter(
            "draftgate_rule_matches",
            "Requests whose method a policy rule picked, by the rule's position in the policy.",
            ["model", "rule"],
            registry=r,
        )
        self.affinity_routes = Counter(
            "draftgate_affinity_routes",
            "Requests routed by session key: to the key's own backend (home) or, that one "
            "being past its load bound, to the key's next choice (spilled).",
            ["model", "outcome"],
            registry=r,
        )
        self.clients_cut = Counter(
            "draftgate_clients_cut",
            "Streams cut because their client read nothing for DRAFTGATE_CLIENT_WRITE_TIMEOUT_S "
            "(recorded as client_stalled, 499).",
            ["model"],
            registry=r,
        )
        self.retries = Counter(
            "draftgate_upstream_retries",
            "Requests retried on another backend before their first byte.",
            ["model"],
            registry=r,
        )
        self.rejections = Counter(
            "draftgate_rejections",
            "Requests refused before routing, by reason.",
            ["reason"],
            registry=r,
        )

    def _lossless(self, r: CollectorRegistry) -> None:
        """The lossless watchdog's checks and drops (gateway/relay/shadow.py)."""
        self.lossless_checks = Counter(
            "draftgate_lossless_checks",
            "Served answers the lossless watchdog compared with their replay on the model's "
            "reference method, by the served method and backend and whether they diverged "
            '(result="match" or "diverged"); method equal to reference is the floor.',
            ["model", "method", "backend", "reference", "result"],
            registry=r,
        )
        self.lossless_dropped = Counter(
            "draftgate_lossless_dropped",
            "Samples the lossless watchdog dropped unreplayed: over its cap per minute "
            '("cap"), its queue full ("queue"), no healthy reference backend ("no_reference"), '
            'or the replay failed ("replay_failed").',
            ["model", "reason"],
            registry=r,
        )

    def _fair_share(self, r: CollectorRegistry) -> None:
        """The fair-share queue of each model whose backends are full (relay/fairshare.py)."""
        self.fair_queue_waiting = Gauge(
            "draftgate_fair_queue_waiting",
            "Requests waiting in the model's fair-share queue for room on its backends.",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.fair_queue_wait = Histogram(
            "draftgate_fair_queue_wait_seconds",
            "Time requests that found the model's backends full waited to be let in.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.fair_queue_refusals = Counter(
            "draftgate_fair_queue_refusals",
            'Requests the fair-share queue answered 429: it was full ("queue_full") or they '
            'waited past its timeout ("queue_timeout").',
            ["model", "reason"],
            registry=r,
        )

    def _backends(self, r: CollectorRegistry) -> None:
        """Each backend: in flight, health, declared method, acceptance, its in-flight clock."""
        self.in_flight = Gauge(
            "draftgate_backend_in_flight",
            "Requests in flight per backend.",
            BACKEND,
            registry=r,
            multiprocess_mode="livesum",
        )
        self.healthy = Gauge(
            "draftgate_backend_healthy",
            "1 if the backend is healthy and its circuit breaker closed.",
            BACKEND,
            registry=r,
        )
        self.mismatch = Gauge(
            "draftgate_backend_method_mismatch",
            "1 if the backend's spec-decode counters contradict its declared method.",
            BACKEND,
            registry=r,
        )
        self.backend_info = Gauge(
            "draftgate_backend_info",
            "1 per enabled backend with its method, drafter and /version ('' before read).",
            [*BACKEND, "method", "drafter", "engine_version"],
            registry=r,
        )
        self.acceptance_length = Gauge(
            "draftgate_backend_acceptance_length",
            "Mean acceptance length (1 + accepted / drafts) of the backend's last scrape "
            "interval in which it drafted; absent for plain backends.",
            BACKEND,
            registry=r,
        )
        self.windows_rejected = Counter(
            "draftgate_measurement_windows_rejected",
            "Collector windows not stored as measurements, by reason: too few requests or "
            "output tokens, no request in flight, a rate above the hardware's ceiling, the "
            "drafter or engine version changed mid-window.",
            [*BACKEND, "reason"],
            registry=r,
        )
        self.in_flight_seconds = Counter(
            "draftgate_backend_in_flight_seconds",
            "Request-seconds in flight per backend (its rate is the mean requests in flight).",
            BACKEND,
            registry=r,
        )
        self.busy_seconds = Counter(
            "draftgate_backend_busy_seconds",
            "Seconds with at least one request in flight per backend (summed over workers).",
            BACKEND,
            registry=r,
        )
        self.backend_requests_ended = Counter(
            "draftgate_backend_requests_ended",
            "Requests sent to each backend that ended, whatever their outcome.",
            BACKEND,
            registry=r,
        )

    def _pricing(self, r: CollectorRegistry) -> None:
        """What the selector and planner see: replicas wanted, prices per method, fit error."""
        self.desired_replicas = Gauge(
            "draftgate_desired_replicas",
            "Replicas each method pool of a model needs at its current load (autoscaling).",
            ["model", "method"],
            registry=r,
        )
        self.method_usd_per_mtok = Gauge(
            "draftgate_method_usd_per_mtok",
            "Capacity cost ($ per 1M output tokens) of each method with a healthy backend at "
            "the model's current load, as the selector prices it.",
            ["model", "method"],
            registry=r,
        )
        self.plain_usd_per_mtok = Gauge(
            "draftgate_method_plain_usd_per_mtok",
            "What plain decoding would cost ($ per 1M output tokens) on the same GPUs at the "
            "same load as each method of draftgate_method_usd_per_mtok.",
            ["model", "method"],
            registry=r,
        )
        self.planner_error = Gauge(
            "draftgate_planner_error_ratio",
            "Mean relative error of the planner's curve shape on the model's measured points "
            "(each predicted from its nearest measured neighbour), over its curves with two "
            "or more measured points.",
            ["model"],
            registry=r,
        )

    def _replica(self, r: CollectorRegistry) -> None:
        """Key and team budgets and this replica's readiness."""
        self.budget_used = Gauge(
            "draftgate_key_budget_used_ratio",
            "Share of each budgeted API key's budget spent in its current period.",
            ["key_id", "key_name"],
            registry=r,
        )
        self.team_budget_used = Gauge(
            "draftgate_team_budget_used_ratio",
            "Share of each budgeted team's budget its keys spent in its current period.",
            ["team_id", "team_name"],
            registry=r,
        )
        self.pool_discovery_ok = Gauge(
            "draftgate_pool_discovery_ok",
            "1 if the pool's source (DNS or the Kubernetes API) last gave its members, 0 if it "
            "failed or gave no address (its members last seen are kept); exported by the "
            "replica that discovers (it holds the discovery lease).",
            ["pool"],
            registry=r,
        )
        self.ready = Gauge(
            "draftgate_ready",
            "1 if this replica is ready (GET /ready would answer 200), checked at the probe "
            "interval.",
            registry=r,
        )

    def _ledger_queue(self, r: CollectorRegistry) -> None:
        """The ledger's queue of usage records."""
        self.ledger_pending = Gauge(
            "draftgate_ledger_pending",
            "Usage records waiting to be written.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ledger_dropped = Counter(
            "draftgate_ledger_dropped",
            "Usage records dropped because the pending queue was full.",
            registry=r,
        )

    def _webhooks(self, r: CollectorRegistry) -> None:
        """Webhook deliveries."""
        self.webhook_events = Counter(
            "draftgate_webhook_events",
            "Webhook events per URL by type and outcome: sent, failed (attempts used up or "
            "refused with a 4xx), dropped (the URL's queue was full).",
            ["type", "outcome"],
            registry=r,
        )
        self.webhook_retries = Counter(
            "draftgate_webhook_retries",
            "Webhook delivery attempts after an event's first, by type.",
            ["type"],
            registry=r,
        )
        self.webhook_queued = Gauge(
            "draftgate_webhook_queued", "Webhook events waiting, over every URL.", registry=r
        )

    def _records(self, r: CollectorRegistry) -> None:
        """What becomes of usage: values refused, requests unpriced, records pruned and written."""
        self.usage_rejected = Counter(
            "draftgate_usage_values_rejected",
            "Token counts a backend reported that are not whole numbers in range (recorded as 0).",
            ["field"],
            registry=r,
        )
        self.unpriced = Counter(
            "draftgate_unpriced_requests",
            "Requests with no throughput curve to price them: `gpu_time` when charged at their "
            "share of the backend's GPU time instead, `no_price` when the GPU has no price.",
            ["model", "reason"],
            registry=r,
        )
        self.usage_pruned = Counter(
            "draftgate_usage_records_pruned",
            "Raw usage records deleted for their age (`usage_retention_days`; rollups kept).",
            registry=r,
        )
        self.ledger_refused = Counter(
            "draftgate_ledger_refused",
            "Usage records the database refused for their data (logged, set aside).",
            registry=r,
        )
        self.ledger_written = Counter(
            "draftgate_ledger_written", "Usage records written to the database.", registry=r
        )

    def series(self, metric: Series, *labels: str) -> Series:
        """`metric.labels(*labels)`, looked up once: `labels` takes a lock and checks and
        converts every value on each call, eight times per request. Only for counters and
        histograms, whose series are never removed (a removed series' cached child would
        count where nothing exports)."""
        key = (id(metric), labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]

    def exposition(self) -> bytes:
        """The Prometheus text exposition (the replica's, summed over its workers)."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        return generate_latest(_Families(self._worker_families())) + self.leader_gauges()

    def leader_gauges(self) -> bytes:
        """The replica's gauges: this process's when it leads, else the leader's file."""
        if self.leader_gauges_file is None:
            return generate_latest(_Families(self._replica_families()))
        try:
            return read_private(self.leader_gauges_file)
        except OSError:  # no leader yet (or not its file): no replica gauges, not stale ones
            return b""

    def in_flight_by_backend(self) -> dict[str, float] | None:
        """Requests in flight per backend over every worker, as their probers last set them
        (None without workers: the registry's own count is the replica's then)."""
        if self.multiprocess_dir is None:
            return None
        files = [str(f) for f in self.multiprocess_dir.glob("gauge_livesum_*.db")]
        counts: dict[str, float] = {}
        for family in MultiProcessCollector.merge(files):  # type: ignore[no-untyped-call]
            if family.name == "draftgate_backend_in_flight":
                counts.update((s.labels["backend"], s.value) for s in family.samples)
        return counts

    def queued_by_model(self) -> dict[str, float]:
        """Requests waiting in each model's fair-share queue, over every worker."""
        if self.multiprocess_dir is None:
            families = self.fair_queue_waiting.collect()
        else:
            files = [str(f) for f in self.multiprocess_dir.glob("gauge_livesum_*.db")]
            families = MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
        counts: dict[str, float] = defaultdict(float)
        for family in families:
            if family.name == "draftgate_fair_queue_waiting":
                for s in family.samples:
                    counts[s.labels["model"]] += s.value
        return counts

    def in_flight_clocks(self) -> dict[str, InFlightClock] | None:
        """Each backend's in-flight clock over every worker, as their collectors last
        published it (None without workers: the registry's own clock is the replica's)."""
        if self.multiprocess_dir is None:
            return None
        files = [str(f) for f in self.multiprocess_dir.glob("counter_*.db")]
        parts: dict[str, dict[str, float]] = defaultdict(dict)
        names = {
            "draftgate_backend_in_flight_seconds_total": "in_flight_s",
            "draftgate_backend_busy_seconds_total": "busy_s",
            "draftgate_backend_requests_ended_total": "ended",
        }
        for family in MultiProcessCollector.merge(files):  # type: ignore[no-untyped-call]
            for sample in family.samples:
                if (field := names.get(sample.name)) is not None:
                    parts[sample.labels["backend"]][field] = sample.value
        return {backend: InFlightClock(**fields) for backend, fields in parts.items()}

    def publish_clock(self, backend: str, pool: str, change: InFlightClock) -> None:
        """Count what this process sent `backend` (of `pool`) since it last published."""
        self.in_flight_seconds.labels(backend, pool).inc(change.in_flight_s)
        self.busy_seconds.labels(backend, pool).inc(change.busy_s)
        self.backend_requests_ended.labels(backend, pool).inc(change.ended)

    def _replica_families(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.type == "gauge" and family.name not in SUMMED_GAUGES:
                yield family

    def _worker_families(self) -> Iterator[Metric]:
        assert self.multiprocess_dir is not None
        files = [str(f) for f in self.multiprocess_dir.glob("*.db")]
        merged = {}
        for family in MultiProcessCollector.merge(files):  # type: ignore[no-untyped-call]
            if family.type != "gauge" or family.name in SUMMED_GAUGES:
                merged[family.name] = family
        yield from merged.values()
        for family in self.registry.collect():  # declared, with no series yet in any worker
            summed = family.type != "gauge" or family.name in SUMMED_GAUGES
            if summed and family.name not in merged:
                yield Metric(family.name, family.documentation, family.type)


def forget_backends(metrics: GatewayMetrics, kept: set[str]) -> None:
    """Drop the state gauges' series of backends no longer in the fleet (a deleted one's
    health stayed exported for good). Counters keep theirs: their totals are history."""
    for gauge in (metrics.healthy, metrics.mismatch, metrics.acceptance_length):
        for metric in gauge.collect():
            for sample in metric.samples:
                if sample.labels["backend"] not in kept:
                    gauge.remove(*sample.labels.values())


def set_exactly(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """Set `gauge` to `values` (by label values) and remove every other label set, so a
    series that is gone stops being exported without a moment of no series at all."""
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    for metric in gauge.collect():
        for sample in metric.samples:
            labels = tuple(sample.labels.values())  # in the gauge's label order
            if labels not in values:
                gauge.remove(*labels)
