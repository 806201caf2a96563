"""The simulator's `/metrics`: vLLM's names, types, labels and buckets.

The families simulated are those draftgate reads and the request-latency histograms:
prompt/generation tokens, request successes by finished reason, preemptions, running and
waiting requests, KV-cache usage, TTFT/ITL/TPOT/e2e/queue-time and token-count histograms,
tokens per engine step, the prefix cache's queries and hits with prompt tokens by source
(when prefix caching is on, as in vLLM), and the four spec-decode counters (only when
the method speculates). vLLM 0.32 exposes more (external and multi-modal caches, FLOPs
estimates, per-phase request times, cache config info); those are not simulated.
tests/vllm checks every simulated family against a real vLLM server of the same method:
same name, type, help and label names.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from backends import vllm_metrics as vm

ENGINE = "0"


def _counter(
    registry: CollectorRegistry, metric: vm.MetricName, extra: Sequence[str] = ()
) -> Counter:
    return Counter(metric.name, metric.help, [*vm.LABELS, *extra], registry=registry)


def _histogram(
    registry: CollectorRegistry, metric: vm.MetricName, buckets: Sequence[float]
) -> Histogram:
    return Histogram(metric.name, metric.help, vm.LABELS, buckets=buckets, registry=registry)


class SimMetrics:
    """Every metric one simulated vLLM server exposes, with its label values bound."""

    def __init__(
        self, model: str, max_model_len: int, num_spec_positions: int, prefix_caching: bool
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        labels = {"model_name": model, "engine": ENGINE}
        r = self.registry
        self.prompt_tokens = _counter(r, vm.PROMPT_TOKENS).labels(**labels)
        self.generation_tokens = _counter(r, vm.GENERATION_TOKENS).labels(**labels)
        self._success = _counter(r, vm.REQUEST_SUCCESS, ["finished_reason"])
        for reason in vm.FINISHED_REASONS:  # vLLM exposes every reason from the start
            self._success.labels(**labels, finished_reason=reason)
        self._labels = labels
        self.preemptions = _counter(r, vm.PREEMPTIONS).labels(**labels)
        self.running = Gauge(*_gauge(vm.REQUESTS_RUNNING), registry=r).labels(**labels)
        self.waiting = Gauge(*_gauge(vm.REQUESTS_WAITING), registry=r).labels(**labels)
        self.kv_usage = Gauge(*_gauge(vm.KV_CACHE_USAGE), registry=r).labels(**labels)
        self.ttft = _histogram(r, vm.TTFT, vm.TTFT_BUCKETS_S).labels(**labels)
        self.itl = _histogram(r, vm.ITL, vm.ITL_BUCKETS_S).labels(**labels)
        self.tpot = _histogram(r, vm.TPOT, vm.ITL_BUCKETS_S).labels(**labels)
        self.e2e = _histogram(r, vm.E2E_LATENCY, vm.REQUEST_TIME_BUCKETS_S).labels(**labels)
        self.queue_time = _histogram(r, vm.QUEUE_TIME, vm.REQUEST_TIME_BUCKETS_S).labels(**labels)
        tokens = [float(b) for b in vm.token_buckets(max_model_len)]
        self.prompt_hist = _histogram(r, vm.PROMPT_TOKENS_HIST, tokens).labels(**labels)
        self.generation_hist = _histogram(r, vm.GENERATION_TOKENS_HIST, tokens).labels(**labels)
        iteration = [float(b) for b in vm.ITERATION_TOKENS_BUCKETS]
        self.iteration_tokens = _histogram(r, vm.ITERATION_TOKENS, iteration).labels(**labels)
        self.spec = SpecMetrics(r, labels, num_spec_positions) if num_spec_positions else None
        self.prefix = PrefixCacheMetrics(r, labels) if prefix_caching else None

    def success(self, finished_reason: str) -> None:
        """Count one finished request by its reason (stop, length, abort)."""
        self._success.labels(**self._labels, finished_reason=finished_reason).inc()

    def exposition(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


def _gauge(metric: vm.MetricName) -> tuple[str, str, Sequence[str]]:
    return metric.name, metric.help, vm.LABELS


class SpecMetrics:
    """vLLM's spec-decode counters; only registered when the server speculates."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str], positions: int):
        self.drafts = _counter(registry, vm.SPEC_DRAFTS).labels(**labels)
        self.draft_tokens = _counter(registry, vm.SPEC_DRAFT_TOKENS).labels(**labels)
        self.accepted_tokens = _counter(registry, vm.SPEC_ACCEPTED_TOKENS).labels(**labels)
        per_pos = _counter(registry, vm.SPEC_ACCEPTED_PER_POS, ["position"])
        self.accepted_per_pos = [
            per_pos.labels(**labels, position=str(i)) for i in range(positions)
        ]

    def record(self, drafts: int, draft_tokens: int, accepted_per_pos: Sequence[int]) -> None:
        """One engine step's drafts; `accepted_per_pos[i]` drafts had position i accepted."""
        if not drafts:
            return
        self.drafts.inc(drafts)
        self.draft_tokens.inc(draft_tokens)
        self.accepted_tokens.inc(sum(accepted_per_pos))
        for counter, accepted in zip(self.accepted_per_pos, accepted_per_pos, strict=False):
            if accepted:
                counter.inc(accepted)


class PrefixCacheMetrics:
    """vLLM's prefix-cache counters and where prompt tokens came from."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.queries = _counter(registry, vm.PREFIX_CACHE_QUERIES).labels(**labels)
        self.hits = _counter(registry, vm.PREFIX_CACHE_HITS).labels(**labels)
        self.cached = _counter(registry, vm.PROMPT_TOKENS_CACHED).labels(**labels)
        by_source = _counter(registry, vm.PROMPT_TOKENS_BY_SOURCE, ["source"])
        self.by_source = {s: by_source.labels(**labels, source=s) for s in vm.PROMPT_SOURCES}

    def record(self, queries: int, hits: int, computed: int, cached: int) -> None:
        """One step's lookups, and the prompt tokens of requests admitted the first time."""
        if queries:
            self.queries.inc(queries)
        if hits:
            self.hits.inc(hits)
        if computed:
            self.by_source["local_compute"].inc(computed)
        if cached:
            self.by_source["local_cache_hit"].inc(cached)
            self.cached.inc(cached)
