"""Properties of the two parsers that read bytes from backends: the SSE usage tap and the
vLLM metrics page. Any input either parses or fails with the documented error."""

from __future__ import annotations

import itertools
import math
import os

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from backends import vllm_metrics as vm
from backends.vllm_metrics import parse_metrics
from gateway.relay.sse import UsageTap

SCALE = int(os.environ.get("FUZZ_SCALE", "1"))  # e.g. FUZZ_SCALE=100 for a long run
FUZZ = settings(
    max_examples=300 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# --- The SSE usage tap (gateway/relay/sse.py) ---

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[list[bytes], dict[str, int] | None, bool]:
    """A valid OpenAI stream: content events with cumulative usage, maybe a usage-only
    event, then `[DONE]`; returns its events, the final usage and whether it ends cut short."""
    count = draw(st.integers(0, 8))
    prompt = draw(st.integers(0, 10_000))
    events, completion = [], 0
    for index in range(count):
        completion += draw(st.integers(1, 50))
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        delta = {"content": draw(TEXT)}
        body = {"id": f"c{index}", "choices": [{"index": 0, "delta": delta}], "usage": usage}
        events.append(b"data: " + orjson.dumps(body) + b"\n\n")
    final: dict[str, int] | None = orjson.loads(events[-1][6:])["usage"] if events else None
    if draw(st.booleans()):
        final = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        events.append(b"data: " + orjson.dumps({"choices": [], "usage": final}) + b"\n\n")
    cut_short = draw(st.booleans())
    if not cut_short:
        events.append(b"data: [DONE]\n\n")
    return events, final, cut_short


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (clamped, sorted, duplicates giving empty chunks)."""
    points = sorted(min(c, len(data)) for c in cuts)
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def relay(tap: UsageTap, chunks: list[bytes]) -> bytes:
    return b"".join(tap.feed(c) for c in chunks) + tap.finish()


@FUZZ
@given(sse_streams(), st.lists(st.integers(0, 4000), max_size=12), st.booleans())
def test_any_chunk_split_of_a_stream_gives_the_same_bytes_and_usage(
    stream: tuple[list[bytes], dict[str, int] | None, bool], cuts: list[int], strip: bool
) -> None:
    events, final, _ = stream
    whole = b"".join(events)
    reference, split = UsageTap(strip), UsageTap(strip)
    expected = relay(reference, events)
    assert relay(split, split_at(whole, cuts)) == expected
    assert split.usage == reference.usage == final
    assert split.chunks == reference.chunks


@FUZZ
@given(sse_streams(), st.lists(st.integers(0, 4000), max_size=12))
def test_only_the_usage_only_event_is_stripped(
    stream: tuple[list[bytes], dict[str, int] | None, bool], cuts: list[int]
) -> None:
    events, _, _ = stream
    kept = [e for e in events if b'"choices":[]' not in e]
    assert relay(UsageTap(True), split_at(b"".join(events), cuts)) == b"".join(kept)
    assert relay(UsageTap(False), split_at(b"".join(events), cuts)) == b"".join(events)


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=10), st.booleans())
def test_arbitrary_bytes_never_raise_and_pass_through(chunks: list[bytes], strip: bool) -> None:
    tap = UsageTap(strip)
    out = relay(tap, chunks)
    assert tap.usage is None or isinstance(tap.usage, dict)
    if not strip:  # nothing is ever dropped unless the client did not ask for usage
        assert out == b"".join(chunks)


@FUZZ
@given(
    st.lists(
        st.sampled_from(
            [
                b"data: ",
                b"{",
                b"}",
                b'"choices":[]',
                b'"usage":',
                b"\n\n",
                b"[DONE]",
                b"\xff",
                b"1",
                b"null",
                b'{"a":1}',
            ]
        ),
        max_size=30,
    ),
    st.booleans(),
)
def test_sse_like_garbage_never_raises(pieces: list[bytes], strip: bool) -> None:
    tap = UsageTap(strip)
    out = relay(tap, pieces)
    assert len(out) <= len(b"".join(pieces))
    assert tap.usage is None or isinstance(tap.usage, dict)


# --- The vLLM metrics parser (backends/vllm_metrics.py) ---

COUNT = st.integers(0, 10**12).map(float)
GAUGE = st.floats(0, 1e6, allow_nan=False)


@st.composite
def vllm_pages(draw: st.DrawFn) -> tuple[bytes, dict[str, float], list[float] | None]:
    """A vLLM /metrics page from prometheus_client with generated values over one or more
    engines; the expected sums and per-position acceptance (None without speculation)."""
    engines = draw(st.lists(st.sampled_from("0123"), min_size=1, max_size=3, unique=True))
    registry = CollectorRegistry()
    labels = list(vm.LABELS)
    names = [vm.PROMPT_TOKENS, vm.GENERATION_TOKENS]
    speculating = draw(st.booleans())
    if speculating:
        names += [vm.SPEC_DRAFTS, vm.SPEC_DRAFT_TOKENS, vm.SPEC_ACCEPTED_TOKENS]
    counters = {m.name: Counter(m.name, m.help, labels, registry=registry) for m in names}
    gauges = {
        m.name: Gauge(m.name, m.help, labels, registry=registry)
        for m in (vm.REQUESTS_RUNNING, vm.REQUESTS_WAITING, vm.KV_CACHE_USAGE)
    }
    e2e = Histogram(
        vm.E2E_LATENCY.name,
        vm.E2E_LATENCY.help,
        labels,
        registry=registry,
        buckets=vm.REQUEST_TIME_BUCKETS_S,
    )
    positions = draw(st.integers(1, 8)) if speculating else 0
    per_pos = Counter(
        vm.SPEC_ACCEPTED_PER_POS.name,
        vm.SPEC_ACCEPTED_PER_POS.help,
        [*labels, "position"],
        registry=registry,
    )  # registered always; exposed only once a position has a value
    expected = dict.fromkeys([*counters, *gauges, "e2e_sum"], 0.0)
    accepted = [0.0] * positions
    for engine in engines:
        bound = {"model_name": "m/x", "engine": engine}
        for name, counter in counters.items():
            value = draw(COUNT)
            counter.labels(**bound).inc(value)
            expected[name] += value
        for name, gauge in gauges.items():
            value = draw(GAUGE)
            gauge.labels(**bound).set(value)
            expected[name] += value
        latencies = e2e.labels(**bound)  # exposed from creation, observed or not
        for latency in draw(st.lists(st.floats(0, 1e4, allow_nan=False), max_size=5)):
            latencies.observe(latency)
            expected["e2e_sum"] += latency
        for position in range(positions):
            value = draw(COUNT)
            per_pos.labels(**bound, position=str(position)).inc(value)
            accepted[position] += value
    return generate_latest(registry), expected, accepted if speculating else None


def close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


@FUZZ
@given(vllm_pages())
def test_generated_exposition_round_trips(
    page: tuple[bytes, dict[str, float], list[float] | None],
) -> None:
    text, expected, accepted = page
    snapshot = parse_metrics(text.decode())
    assert close(snapshot.prompt_tokens, expected[vm.PROMPT_TOKENS.name])
    assert close(snapshot.generation_tokens, expected[vm.GENERATION_TOKENS.name])
    assert close(snapshot.running, expected[vm.REQUESTS_RUNNING.name])
    assert close(snapshot.waiting, expected[vm.REQUESTS_WAITING.name])
    assert close(snapshot.kv_cache_usage, expected[vm.KV_CACHE_USAGE.name])
    assert close(snapshot.e2e_latency_sum_s, expected["e2e_sum"])
    if accepted is None:
        assert snapshot.drafts is None
        assert snapshot.accepted_per_position is None
        return
    assert close(snapshot.drafts, expected[vm.SPEC_DRAFTS.name])
    assert close(snapshot.accepted_tokens, expected[vm.SPEC_ACCEPTED_TOKENS.name])
    assert snapshot.accepted_per_position is not None
    assert len(snapshot.accepted_per_position) == len(accepted)
    assert all(close(a, b) for a, b in zip(snapshot.accepted_per_position, accepted, strict=True))


METRIC_LINES = st.sampled_from(
    [
        "# HELP vllm:generation_tokens_total x",
        "# TYPE vllm:generation_tokens_total counter",
        "vllm:generation_tokens_total 5",
        'vllm:generation_tokens_total{engine="0"} 1e3',
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 1',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="-1"} 1',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="99999999999"} 1',
        'vllm:spec_decode_num_drafts_total{a="b"} NaN',
        "vllm:num_requests_running +Inf",
        "vllm:kv_cache_usage_perc -1",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
        "vllm:e2e_request_latency_seconds_sum 1",
        'x{le="1"} 2',
        "x{",
        "x 1 2 3",
        "# EOF",
        "",
    ]
)


@FUZZ
@given(st.one_of(st.text(max_size=400), st.lists(METRIC_LINES, max_size=20).map("\n".join)))
def test_any_text_parses_or_raises_value_error(text: str) -> None:
    try:
        snapshot = parse_metrics(text)
    except ValueError:
        return
    assert isinstance(snapshot, vm.VllmSnapshot)
