"""Many slow streams through one gateway replica: memory and file descriptors per 1,000.

Starts bench/mock_upstream.py (one token every `--token-delay-ms`, `--tokens` per answer) and
`draftgate gateway` in front of it, then opens streaming chat completions in steps of
`--step` up to `--streams`, all held open at once (each lasts tokens x delay, longer than the
ramp). After each step, once every stream opened so far has its first chunk: the gateway's
RSS (VmRSS), its open file descriptors, and RSS per 1,000 streams above the idle gateway.
Then every stream is read to its end: one that ends early or without `[DONE]` is dropped.

The load generator is this process (raw asyncio sockets, one per stream); it, the mock and
the gateway lift their soft open-files limit to the hard one (two sockets per stream in the
gateway).

With `--workers N` the gateway runs N worker processes: memory is summed over the supervisor
and its workers (PSS beside RSS, since forked workers share pages), and the open-files limit
applies to each process alone.

Run: .venv/bin/python bench/idle_streams.py [--streams 10000] [--step 1000]
         [--token-delay-ms 1000] [--tokens 90] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import (
    MODEL,
    REPO,
    Processes,
    Target,
    free_port,
    start_draftgate,
    wait_ready,
)

FIRST_CHUNK_TIMEOUT_S = 120.0


@dataclass
class Streams:
    """What the streams saw so far."""

    opened: int = 0
    first_chunk: int = 0
    finished: int = 0  # ended with [DONE] after every token
    dropped: list[str] = field(default_factory=list)  # why each that did not


def raise_open_files_limit(streams: int) -> int:
    """The open-files limit (soft and, where allowed, hard) up to what `streams` need in the
    gateway, two sockets each, with room to spare; children inherit it. The new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * streams + 4096
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:  # only a privileged process may raise its hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return needed
        except (ValueError, OSError):
            print(f"hard open-files limit {hard}: fewer than {needed} for {streams} streams")
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return wanted


def request(port: int, i: int) -> bytes:
    body = json.dumps({
        "model": MODEL,
        "messages": [{"role": "user", "content": f"stream {i}"}],
        "max_tokens": 4096,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def one_stream(port: int, i: int, tokens: int, seen: Streams) -> None:
    """Open a stream, read it to the end, count what it got."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        seen.dropped.append(f"connect: {exc}")
        return
    seen.opened += 1
    chunks, first = 0, True
    try:
        writer.write(request(port, i))
        status = await reader.readline()
        if b" 200 " not in status:
            seen.dropped.append(f"status {status.decode(errors='replace').strip()}")
            return
        while line := await reader.readline():
            if line.startswith(b"data: [DONE]"):
                if chunks >= tokens:
                    seen.finished += 1
                else:
                    seen.dropped.append(f"[DONE] after {chunks} of {tokens} tokens")
                return
            if line.startswith(b'data: {"') and b'"content"' in line:
                chunks += 1
                if first:
                    seen.first_chunk, first = seen.first_chunk + 1, False
        seen.dropped.append(f"closed after {chunks} of {tokens} tokens")
    except OSError as exc:
        seen.dropped.append(f"read: {exc}")
    finally:
        writer.close()


async def until_streaming(seen: Streams, count: int) -> None:
    """Until `count` streams have had their first chunk (or were dropped), or the timeout."""
    deadline = time.monotonic() + FIRST_CHUNK_TIMEOUT_S
    while seen.first_chunk + len(seen.dropped) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)


def gateway_pids(pid: int) -> list[int]:
    """The gateway's process and, with workers, each worker (the supervisor's children)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(int(c) for c in children)]


def memory_mb(pid: int, field: str) -> float:
    """`field` (VmRSS from status, Pss from smaps_rollup) summed over the gateway's processes:
    RSS counts the pages workers share from their fork once per worker, PSS splits them."""
    total = 0.0
    for p in gateway_pids(pid):
        source = "status" if field == "VmRSS" else "smaps_rollup"
        for line in Path(f"/proc/{p}/{source}").read_text().splitlines():
            if line.startswith(f"{field}:"):
                total += int(line.split()[1]) / 1024
    return total


def open_fds(pid: int) -> tuple[int, int]:
    """Open descriptors over the gateway's processes, and the most any one holds (the
    open-files limit is per process)."""
    counts = [len(os.listdir(f"/proc/{p}/fd")) for p in gateway_pids(pid)]
    return sum(counts), max(counts)


async def run(args: argparse.Namespace, gateway_port: int, gateway_pid: int) -> Streams:
    seen = Streams()
    idle, idle_pss = memory_mb(gateway_pid, "VmRSS"), memory_mb(gateway_pid, "Pss")
    print(f"idle gateway ({len(gateway_pids(gateway_pid))} processes): RSS {idle:.1f} MB, "
          f"PSS {idle_pss:.1f} MB, {open_fds(gateway_pid)[0]} fds")  # fmt: skip
    print(f"{'streams':>8} {'RSS MB':>8} {'MB per 1k':>10} {'PSS MB':>8} {'PSS per 1k':>10} "
          f"{'fds':>7} {'most fds':>8} {'open s':>7}")  # fmt: skip
    tasks: list[asyncio.Task[None]] = []
    for target in range(args.step, args.streams + 1, args.step):
        started = time.monotonic()
        for i in range(len(tasks), target):
            tasks.append(asyncio.create_task(one_stream(gateway_port, i, args.tokens, seen)))
            if i % 100 == 99:
                await asyncio.sleep(0)  # let connections go out in batches
        await until_streaming(seen, target)
        rss, pss = memory_mb(gateway_pid, "VmRSS"), memory_mb(gateway_pid, "Pss")
        per_k, pss_per_k = (rss - idle) / (target / 1000), (pss - idle_pss) / (target / 1000)
        fds, most = open_fds(gateway_pid)
        print(f"{target:>8} {rss:>8.1f} {per_k:>10.2f} {pss:>8.1f} {pss_per_k:>10.2f} "
              f"{fds:>7} {most:>8} {time.monotonic() - started:>7.1f}", flush=True)  # fmt: skip
    await asyncio.gather(*tasks)
    return seen


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=1_000)
    parser.add_argument("--token-delay-ms", type=float, default=1000.0)
    parser.add_argument("--tokens", type=int, default=90, help="per stream; outlast the ramp")
    parser.add_argument("--workers", type=int, default=1, help="the gateway's worker processes")
    args = parser.parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/idle_streams.py", *argv])
    limit = raise_open_files_limit(args.streams)
    print(f"$ {command}\nopen-files soft limit here and in the children: {limit}")
    with tempfile.TemporaryDirectory(prefix="dg-idle-") as tmp:
        work, procs = Path(tmp), Processes(Path(tmp))
        try:
            port = free_port()
            argv_mock = [sys.executable, str(REPO / "bench" / "mock_upstream.py"), "--port",
                         str(port), "--model", MODEL, "--tokens", str(args.tokens),
                         "--token-delay-ms", str(args.token_delay_ms)]  # fmt: skip
            procs.start("mock", argv_mock, dict(os.environ), work)
            if why := wait_ready(procs, "mock", f"http://127.0.0.1:{port}/health", 20):
                print(why)
                return 1
            room = {
                "DRAFTGATE_UPSTREAM_MAX_CONNECTIONS": str(args.streams + 1000),
                "DRAFTGATE_WORKERS": str(args.workers),
            }
            gateway = start_draftgate(procs, Target("direct", port, None), work, room)
            if isinstance(gateway, str):
                print(gateway)
                return 1
            assert gateway.pid is not None
            seen = asyncio.run(run(args, gateway.port, gateway.pid))
            print(f"opened {seen.opened}, finished {seen.finished}, dropped {len(seen.dropped)}")
            for why in sorted(set(seen.dropped))[:10]:
                print(f"  dropped: {why} (x{seen.dropped.count(why)})")
            return 0 if seen.finished == args.streams else 1
        finally:
            procs.stop_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
