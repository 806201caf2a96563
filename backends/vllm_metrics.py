"""vLLM's Prometheus metrics: names and help texts, parsing a page, the change between two.

This is the one module that knows `vllm:*` names. Names are as registered
(prometheus_client appends `_total` to counters on exposition), from
vllm/v1/metrics/loggers.py and vllm/v1/spec_decode/metrics.py (vLLM 0.32).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

LABELS = ("model_name", "engine")


@dataclass(frozen=True)
class MetricName:
    """A vLLM metric: registered name and its help text."""

    name: str
    help: str


# Counters (exposed with a `_total` suffix).
SPEC_DRAFTS = MetricName("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
SPEC_DRAFT_TOKENS = MetricName("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
SPEC_ACCEPTED_TOKENS = MetricName(
    "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
)
SPEC_ACCEPTED_PER_POS = MetricName(
    "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position."
)
PROMPT_TOKENS = MetricName("vllm:prompt_tokens", "Number of prefill tokens processed.")
GENERATION_TOKENS = MetricName("vllm:generation_tokens", "Number of generation tokens processed.")
REQUEST_SUCCESS = MetricName("vllm:request_success", "Count of successfully processed requests.")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # its `finished_reason`
PREEMPTIONS = MetricName("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
PREFIX_CACHE_QUERIES = MetricName(
    "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
)
PREFIX_CACHE_HITS = MetricName(
    "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
)
PROMPT_TOKENS_BY_SOURCE = MetricName(
    "vllm:prompt_tokens_by_source", "Number of prompt tokens by source."
)
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # its `source`
PROMPT_TOKENS_CACHED = MetricName(
    "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
)

# Gauges.
REQUESTS_RUNNING = MetricName(
    "vllm:num_requests_running", "Number of requests in model execution batches."
)
REQUESTS_WAITING = MetricName(
    "vllm:num_requests_waiting", "Number of requests waiting to be processed."
)
KV_CACHE_USAGE = MetricName(
    "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
)
# Deprecated in vLLM 0.9; older servers expose this instead of KV_CACHE_USAGE.
GPU_CACHE_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"

# Histograms, with vLLM's buckets.
TTFT = MetricName(
    "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."
)
ITL = MetricName("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")
TPOT = MetricName(
    "vllm:request_time_per_output_token_seconds",
    "Histogram of time_per_output_token_seconds per request.",
)
E2E_LATENCY = MetricName(
    "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."
)
QUEUE_TIME = MetricName(
    "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."
)
PROMPT_TOKENS_HIST = MetricName("vllm:request_prompt_tokens", "Number of prefill tokens processed.")
GENERATION_TOKENS_HIST = MetricName(
    "vllm:request_generation_tokens", "Number of generation tokens processed."
)
ITERATION_TOKENS = MetricName(
    "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."
)

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_TIME_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 token-count buckets up to `max_model_len`."""
    buckets: list[int] = []
    mantissa, exponent = (1, 2, 5), 0
    while True:
        for m in mantissa:
            value = m * 10**exponent
            if value > max_model_len:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True)
class VllmSnapshot:
    """The counters and gauges draftgate reads from one vLLM `/metrics` page (summed over
    engines and label values). Spec-decode fields are None when the server does not
    speculate (vLLM registers them only with a speculative config)."""

    generation_tokens: float
    prompt_tokens: float
    running: float
    waiting: float
    kv_cache_usage: float | None
    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    accepted_per_position: tuple[float, ...] | None
    e2e_latency_sum_s: float | None = None  # Σ latency of finished requests (Little's law)
    e2e_latency_count: float | None = None  # requests finished
    prefix_cache_queries: float | None = None  # tokens looked up (None: caching not exposed)
    prefix_cache_hits: float | None = None  # of which found cached


def parse_metrics(text: str) -> VllmSnapshot:
    """Read a vLLM `/metrics` page; tolerant of missing families and older names.

    Raises ValueError (only) when the page is not Prometheus text or a position is not a number.
    """
    sums: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if sample.name in (E2E_LATENCY.name + "_sum", E2E_LATENCY.name + "_count"):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                continue
            if family.name == SPEC_ACCEPTED_PER_POS.name:
                position = int(sample.labels.get("position", "0"))
                per_position[position] = per_position.get(position, 0.0) + sample.value
            sums[family.name] = sums.get(family.name, 0.0) + sample.value
    kv = sums.get(KV_CACHE_USAGE.name, sums.get(GPU_CACHE_USAGE_LEGACY))
    spec = SPEC_DRAFTS.name in sums
    positions = tuple(per_position[i] for i in sorted(per_position)) if per_position else None
    return VllmSnapshot(
        generation_tokens=sums.get(GENERATION_TOKENS.name, 0.0),
        prompt_tokens=sums.get(PROMPT_TOKENS.name, 0.0),
        running=sums.get(REQUESTS_RUNNING.name, 0.0),
        waiting=sums.get(REQUESTS_WAITING.name, 0.0),
        kv_cache_usage=kv,
        drafts=sums.get(SPEC_DRAFTS.name) if spec else None,
        draft_tokens=sums.get(SPEC_DRAFT_TOKENS.name) if spec else None,
        accepted_tokens=sums.get(SPEC_ACCEPTED_TOKENS.name) if spec else None,
        accepted_per_position=positions if spec else None,
        e2e_latency_sum_s=sums.get(E2E_LATENCY.name + "_sum"),
        e2e_latency_count=sums.get(E2E_LATENCY.name + "_count"),
        prefix_cache_queries=sums.get(PREFIX_CACHE_QUERIES.name),
        prefix_cache_hits=sums.get(PREFIX_CACHE_HITS.name),
    )


@dataclass(frozen=True)
class Observation:
    """What happened at one backend between two scrapes."""

    seconds: float
    output_tokens: float
    drafts: float
    accepted: float
    accepted_per_position: tuple[float, ...]
    running: float  # requests running or waiting at the later scrape (from every client)
    latency_s: float = 0.0  # Σ end-to-end latency of the requests that finished meanwhile
    finished: float | None = None  # requests that finished meanwhile (None: not exposed)
    prompt_tokens: float = 0.0


def difference(before: VllmSnapshot, after: VllmSnapshot, seconds: float) -> Observation | None:
    """The interval between two snapshots; None after a restart (a counter went down)."""
    tokens = after.generation_tokens - before.generation_tokens
    if seconds <= 0 or tokens < 0:
        return None
    drafts = accepted = 0.0
    per_position: tuple[float, ...] = ()
    if after.drafts is not None and before.drafts is not None:
        drafts = after.drafts - before.drafts
        accepted = (after.accepted_tokens or 0.0) - (before.accepted_tokens or 0.0)
        old, new = before.accepted_per_position or (), after.accepted_per_position or ()
        per_position = tuple(n - (old[i] if i < len(old) else 0.0) for i, n in enumerate(new))
        if drafts < 0 or accepted < 0 or any(p < 0 for p in per_position):
            return None
    return Observation(
        seconds,
        tokens,
        drafts,
        accepted,
        per_position,
        after.running + after.waiting,
        _finished_latency_s(before, after),
        _finished(before, after),
        max(after.prompt_tokens - before.prompt_tokens, 0.0),
    )


def _finished(before: VllmSnapshot, after: VllmSnapshot) -> float | None:
    if before.e2e_latency_count is None or after.e2e_latency_count is None:
        return None
    return max(after.e2e_latency_count - before.e2e_latency_count, 0.0)


def _finished_latency_s(before: VllmSnapshot, after: VllmSnapshot) -> float:
    if before.e2e_latency_sum_s is None or after.e2e_latency_sum_s is None:
        return 0.0
    return max(after.e2e_latency_sum_s - before.e2e_latency_sum_s, 0.0)
