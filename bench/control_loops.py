"""What the gateway's control loops cost per pool member: discovery, health probes and
`/metrics` scrapes, for a pool of 64 members and a fleet of 500, found by DNS and through the
Kubernetes API, side by side in one run.

Run: .venv/bin/python bench/control_loops.py [--window 30]
A real `draftgate gateway` (one worker, SQLite, default intervals: discovery 10 s, probes 5 s,
scrapes 5 s) is given pools whose members are loopback addresses (127.0.1.1 ...), all served
by one stub process here that answers `/health`, `/v1/models` and a simulated vLLM
`/metrics` page; the names are answered by dnsmasq (tests/dns_server.py) or the stand-in
Kubernetes API (tests/kube_api.py). Once every member has joined, the gateway's CPU time
(user + system, from /proc) is read over the window with no client traffic; the idle gateway
with no backend is the baseline. Figures: CPU-ms per member per minute above the baseline,
the share of one core, and the stub's count of probes and scrapes per member per minute
(each should be 12: one every 5 s), and how many members the gateway counts healthy at the
end. The stub is one Python process: it answers 500 concurrent requests in about 8 s, so at
500 members the rates and health it shows are bounded by it, not only by the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from backends.sim.metrics import SimMetrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' real servers

from tests.dns_server import DnsServer
from tests.e2e.conftest import ADMIN_TOKEN, Server, free_port, gateway_env, spawn_server
from tests.kube_api import KubeApi

TICKS = os.sysconf("SC_CLK_TCK")
JOIN_TIMEOUT_S = 300.0
TOKEN, NAMESPACE = "bench-token", "bench"
MODEL = "bench/model"
METHODS = ("plain", "eagle3", "p-eagle", "dflash", "dspark")
TEMPLATES: dict[str, dict[str, Any]] = {
    "plain": {"method": "plain"},
    "eagle3": {"method": "eagle3", "k": 3, "drafter": "d/eagle3"},
    "p-eagle": {"method": "p-eagle", "k": 7, "drafter": "d/p-eagle"},
    "dflash": {"method": "dflash", "k": 15, "drafter": "d/dflash"},
    "dspark": {"method": "dspark", "k": 7, "drafter": "d/dspark"},
}


class StubFleet:
    """Many loopback addresses on one port, answering as a vLLM server does for the loops."""

    def __init__(self, addresses: list[str], port: int) -> None:
        self.addresses, self.port = addresses, port
        metrics = SimMetrics(MODEL, 4096, 7, prefix_caching=True).exposition()
        models = (
            b'{"object":"list","data":[{"id":"bench/model","object":"model","max_model_len":4096}]}'
        )
        self.pages = {"/health": b"", "/metrics": metrics, "/v1/models": models}
        self.seen: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self.ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        for address in self.addresses:
            self.loop.run_until_complete(asyncio.start_server(self._serve, address, self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                path = line.split(b" ")[1].decode().partition("?")[0] if b" " in line else ""
                while await reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                body = self.pages.get(path)
                self.seen[path] += 1
                status = b"200 OK" if body is not None else b"404 Not Found"
                body = body if body is not None else b""
                writer.write(
                    b"HTTP/1.1 %s\r\ncontent-length: %d\r\ncontent-type: text/plain\r\n\r\n%s"
                    % (status, len(body), body)
                )
                await writer.drain()
        except (ConnectionError, IndexError):
            pass
        finally:
            writer.close()


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds, children included (its worker processes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / TICKS


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += cpu_s(current)
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending += [int(c) for c in children]
    return total


def addresses(count: int) -> list[str]:
    return [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(count)]


def run(
    label: str,
    pools: int,
    per_pool: int,
    source: str,
    window_s: float,
    stub: StubFleet,
    work: Path,
    dns: DnsServer,
    kube: KubeApi,
) -> dict[str, float]:
    """One configuration: the gateway's CPU over the window, once every member joined."""
    directory = work / label.replace(" ", "-")
    directory.mkdir()
    members = addresses(pools * per_pool)
    declared = []
    for p in range(pools):
        group, method = members[p * per_pool : (p + 1) * per_pool], METHODS[p % len(METHODS)]
        name = f"{method}-{p}"
        if source == "dns":
            dns_name = f"{name}.test"
            dns.set(dns_name, group)
            found_at: dict[str, Any] = {"dns": dns_name}
        else:
            kube.set_endpoints(NAMESPACE, name, dict.fromkeys(group, True))
            found_at = {"service": name}
        declared.append(
            {
                "name": name,
                "discovery": {**found_at, "port": stub.port},
                "backend": {"model": MODEL, **TEMPLATES[method], "gpu_type": "H100"},
            }
        )
    fleet = directory / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"pools": declared, "models": []}))
    account = directory / "account"
    account.mkdir()
    (account / "token").write_text(TOKEN)
    (account / "namespace").write_text(NAMESPACE)
    env = gateway_env(
        f"sqlite:///{directory}/draftgate.db",
        fleet,
        DNS_SERVER=dns.address,
        KUBE_API_URL=kube.url,
        KUBE_SERVICE_ACCOUNT_DIR=str(account),
        WORKERS="1",
        PROBE_INTERVAL_S="5",
        COLLECT_INTERVAL_S="5",
        DISCOVERY_INTERVAL_S="10",
        LOG_LEVEL="warning",
    )
    gateway = spawn_server(("gateway",), env, directory)
    try:
        gateway.wait_healthy()
        joined_in = _wait_joined(gateway, len(members))
        before_seen, before_cpu, start = (
            Counter(stub.seen),
            tree_cpu_s(gateway.process.pid),
            (time.monotonic()),
        )
        time.sleep(window_s)
        cpu, elapsed = tree_cpu_s(gateway.process.pid) - before_cpu, time.monotonic() - start
        seen = stub.seen - before_seen
        with gateway.client(ADMIN_TOKEN) as admin:
            healthy = admin.get("/ready").json().get("backends_healthy", 0)
    finally:
        gateway.close()
    minutes = elapsed / 60
    per_member = max(len(members), 1)
    return {
        "members": len(members),
        "joined_s": joined_in,
        "cpu_s": cpu,
        "core": cpu / elapsed,
        "probes": seen["/health"] / per_member / minutes,
        "scrapes": seen["/metrics"] / per_member / minutes,
        "healthy": healthy,
    }


def _wait_joined(gateway: Server, members: int) -> float:
    start = time.monotonic()
    with gateway.client(ADMIN_TOKEN) as admin:
        while time.monotonic() - start < JOIN_TIMEOUT_S:
            listed = admin.get("/admin/v1/backends").json()["data"]
            if len(listed) >= members:
                return time.monotonic() - start
            time.sleep(1.0)
    raise RuntimeError(f"only {len(listed)} of {members} members joined")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    args = parser.parse_args()
    print(f"command: {' '.join(sys.argv)}")
    configs = [  # label, pools, members per pool, source
        ("idle, no backend", 0, 0, "dns"),
        ("64 members, DNS", 1, 64, "dns"),
        ("64 members, Kubernetes API", 1, 64, "kubernetes"),
        ("500 members, DNS", 5, 100, "dns"),
        ("500 members, Kubernetes API", 5, 100, "kubernetes"),
    ]
    port = free_port()
    stub = StubFleet(addresses(500), port)
    results = {}
    with tempfile.TemporaryDirectory() as tmp, KubeApi(TOKEN, {NAMESPACE}) as kube:
        work = Path(tmp)
        dns = DnsServer(work)
        try:
            for label, pools, per_pool, source in configs:
                results[label] = run(
                    label, pools, per_pool, source, args.window, stub, work, dns, kube
                )
                print(f"  measured {label}", flush=True)
        finally:
            dns.stop()
    idle = results["idle, no backend"]["core"]
    print(f"gateway CPU over {args.window:.0f} s with no client traffic, above the idle gateway")
    print(
        f"{'configuration':<38} {'joined':>7} {'% core':>7} {'ms/member/min':>14}"
        f" {'probes':>7} {'scrapes':>8} {'healthy':>8}"
    )
    for label, r in results.items():
        above = max(r["core"] - idle, 0.0)
        per = above * 60_000 / r["members"] if r["members"] else 0.0
        print(
            f"{label:<38} {r['joined_s']:>6.1f}s {100 * r['core']:>6.2f}% {per:>14.1f}"
            f" {r['probes']:>7.1f} {r['scrapes']:>8.1f} {r['healthy']:>4.0f}/{r['members']:<3.0f}"
        )
    print("probes and scrapes: per member per minute, as the stub counted them (12 at 5 s);")
    print("healthy: members /ready counted healthy at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
