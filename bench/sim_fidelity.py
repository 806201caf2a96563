"""Does the simulator's HTTP server keep the engine model's pace? Client-measured vs model.

Starts `draftgate sim` at time scale 1, drives it with closed-loop streaming clients at each
concurrency, and prints the output tokens/s the clients saw beside what the engine model
predicts for the same request shape (run in virtual time), with the ratio. Also reports the
server's peak resident memory.

Run: .venv/bin/python bench/sim_fidelity.py [--method p-eagle --k 7] [--concurrency 1,4,16,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from backends.sim.calibrate import run_closed_loop
from backends.sim.config import SimConfig

PROMPT_WORDS = 100  # the simulator counts one token per word
OUTPUT_TOKENS = 256


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def stream_once(port: int, payload: bytes) -> int:
    """One streamed completion over a raw socket (a light client, so it is not the
    bottleneck at high concurrency); returns its completion tokens from the usage chunk."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
        f"\r\ncontent-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    tail = b""
    while chunk := await reader.read(65536):
        tail = (tail + chunk)[-1024:]
    writer.close()
    return int(tail.rsplit(b'"completion_tokens":', 1)[1].split(b"}", 1)[0])


async def client(port: int, payload: bytes, stop_at: float) -> float:
    """One closed-loop client; its output tokens/s between its first and last completions
    (so neither ramp-up nor a request cut off by the window skews it)."""
    first = last = 0.0
    tokens = 0
    while time.monotonic() < stop_at or not last:
        usage = await stream_once(port, payload)
        now = time.monotonic()
        if not first:
            first = now
        else:
            tokens, last = tokens + usage, now
    return tokens / (last - first)


async def measure(port: int, model: str, concurrency: int, seconds: float) -> float:
    """Client-side aggregate output tokens/s: the sum of the clients' rates."""
    body = {
        "model": model,
        "prompt": " ".join(["word"] * PROMPT_WORDS),
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    payload = json.dumps(body).encode()
    stop_at = time.monotonic() + seconds
    rates = await asyncio.gather(*(client(port, payload, stop_at) for _ in range(concurrency)))
    return sum(rates)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="openai/gpt-oss-20b")
    parser.add_argument("--method", default="p-eagle")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--gpu", default="B200")
    parser.add_argument("--concurrency", default="1,4,16,64,256")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    port = free_port()
    draftgate = Path(sys.executable).parent / "draftgate"
    argv = [str(draftgate), "sim", "--model", args.model, "--method", args.method, "--k",
            str(args.k), "--gpu", args.gpu, "--port", str(port), "--workload", "chat"]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sys.stderr)  # noqa: S603
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        config = SimConfig(model=args.model, method=args.method, k=args.k, gpu=args.gpu)
        print(f"command: {' '.join(sys.argv)}")
        print(f"server:  {' '.join(argv[1:])}")
        print(f"{'c':>4} {'client tok/s':>13} {'model tok/s':>12} {'ratio':>6} {'server CPU':>11}")
        for c in (int(x) for x in args.concurrency.split(",")):
            cpu_before, wall_before = cpu_seconds(server.pid), time.monotonic()
            got = asyncio.run(measure(port, args.model, c, args.seconds))
            server_cpu = (cpu_seconds(server.pid) - cpu_before) / (time.monotonic() - wall_before)
            want = run_closed_loop(config, c, shape=(PROMPT_WORDS, OUTPUT_TOKENS))
            print(
                f"{c:>4} {got:13.0f} {want.output_tokens_per_s:12.0f} "
                f"{got / want.output_tokens_per_s:6.3f} {server_cpu:11.0%}"
            )
        print(f"server peak RSS: {peak_rss_mb(server.pid):.0f} MB")
        print(json.dumps({"cpu_count": os.cpu_count()}))
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
