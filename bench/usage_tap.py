"""Time the SSE usage tap alone: CPU per stream for vLLM's compact JSON, read by its bytes,
beside the same stream written with spaces or pretty-printed, read as JSON.

Run: .venv/bin/python bench/usage_tap.py [--tokens 32] [--streams 200] [--repeat 15]
     [--baseline DIR]
One stream is a role chunk, a chunk per token with cumulative usage (the gateway asks for
`continuous_usage_stats`), the usage-only chunk and `[DONE]`, fed one event per read
("whole"), each event in two reads cut at its middle ("cut"), or all in one read ("one").
Columns by what the client asked: nothing (the usage chunk and each chunk's usage are cut
out), `include_usage` (each chunk's usage cut out), or both (nothing cut); the speculative
decoding block is cut, as for a client that did not ask for it. `--baseline DIR` times
another checkout's tap on the same bytes, beside this one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
PROMPT_TOKENS = 24
# What the client asked for: (include_usage, continuous_usage_stats).
ASKED = {"asked nothing": (False, False), "include_usage": (True, False), "both": (True, True)}

Writer = Callable[[dict[str, Any]], bytes]


def compact(body: dict[str, Any]) -> bytes:
    """As vLLM writes an event."""
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def spaced(body: dict[str, Any]) -> bytes:
    """As `json.dumps` writes by default: `"usage": {`."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def pretty(body: dict[str, Any]) -> bytes:
    """Pretty-printed over several `data:` lines."""
    lines = json.dumps(body, indent=2).splitlines()
    return "".join(f"data: {line}\n" for line in lines).encode() + b"\n"


def usage(completion: int) -> dict[str, int]:
    total = PROMPT_TOKENS + completion
    return {"prompt_tokens": PROMPT_TOKENS, "total_tokens": total, "completion_tokens": completion}


def stream(write: Writer, tokens: int) -> list[bytes]:
    """One stream's events, in vLLM's field order."""
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}  # fmt: skip
    events = [write(HEAD | {"choices": [role], "usage": usage(0)})]
    for n in range(1, tokens + 1):
        choice = {"index": 0, "delta": {"content": " word"}, "logprobs": None,
                  "finish_reason": "length" if n == tokens else None}  # fmt: skip
        events.append(write(HEAD | {"choices": [choice], "usage": usage(n)}))
    events.append(write(HEAD | {"choices": [], "usage": usage(tokens)}))
    return [*events, b"data: [DONE]\n\n"]


def cut(events: list[bytes]) -> list[bytes]:
    """Each event in two reads, cut at its middle."""
    return [part for e in events for part in (e[: len(e) // 2], e[len(e) // 2 :])]


def one(events: list[bytes]) -> list[bytes]:
    """The whole stream in one read, as a backend faster than the gateway's reads sends it."""
    return [b"".join(events)]


FORMS: dict[str, Writer] = {"compact": compact, "spaced": spaced, "pretty": pretty}
READINGS: dict[str, Callable[[list[bytes]], list[bytes]]] = {"whole": list, "cut": cut, "one": one}


def load_tap(checkout: Path, name: str) -> Any:
    """The `UsageTap` class of a checkout's gateway/relay/sse.py, loaded as module `name`."""
    path = checkout / "gateway" / "relay" / "sse.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"no usage tap at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.UsageTap


def time_streams(tap: Any, reads: list[bytes], asked: tuple[bool, bool], streams: int) -> float:
    """Seconds to relay `streams` streams through fresh taps that cut what was not `asked`."""
    final, every_chunk = asked
    # As the gateway builds it for a client that did not ask for the speculative decoding
    # block (a tap from before the block was cut takes no such argument)
    options = {"strip_speculation": True} if "strip_speculation" in _arguments(tap) else {}
    start = time.perf_counter()
    for _ in range(streams):
        t = tap(not final, not every_chunk, **options)
        for chunk in reads:
            t.feed(chunk)
        t.finish()
    return time.perf_counter() - start


def _arguments(tap: Any) -> tuple[str, ...]:
    code = tap.__init__.__code__
    return tuple(code.co_varnames[: code.co_argcount])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="content chunks per stream")
    parser.add_argument("--streams", type=int, default=200, help="streams per timing")
    parser.add_argument("--repeat", type=int, default=15, help="rounds; the best is kept")
    parser.add_argument("--baseline", type=Path, help="another checkout, timed beside")
    args = parser.parse_args()
    taps = {"this": load_tap(REPO, "tap_this")}
    if args.baseline is not None:
        taps["baseline"] = load_tap(args.baseline, "tap_baseline")
    print(f"command: {' '.join(sys.argv)}")
    print(f"{args.tokens} tokens per stream; us per stream, best of {args.repeat} rounds")
    header = [f"{name}, {label}" for label in ASKED for name in taps]
    print(f"| stream | reads | {' | '.join(header)} |")
    print("|---|---|" + "---|" * len(header))
    cases = [
        (form, reading, read(stream(write, args.tokens)))
        for form, write in FORMS.items()
        for reading, read in READINGS.items()
    ]
    cells = [(reads, asked, tap) for _, _, reads in cases for asked in ASKED.values()
             for tap in taps.values()]  # fmt: skip
    best = [float("inf")] * len(cells)
    for _ in range(args.repeat):  # every cell once a round, so the machine's noise hits all
        for i, (reads, asked, tap) in enumerate(cells):
            best[i] = min(best[i], time_streams(tap, reads, asked, args.streams))
    width = len(ASKED) * len(taps)
    for n, (form, reading, _) in enumerate(cases):
        row = best[n * width : (n + 1) * width]
        figures = " | ".join(f"{b / args.streams * 1e6:.1f}" for b in row)
        print(f"| {form} | {reading} | {figures} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
