"""The shipped alerting rules in a real Prometheus (Debian's `prometheus`), scraping a real
gateway and the simulators behind it on loopback: an alert fires when what it watches
happens, and the others stay quiet.

The test's Prometheus scrapes and evaluates every second and runs deploy/compose/alerts.yml
with each `for:` cut to one second; everything else of every rule is as shipped
(tests/unit/alerts_test.yml checks the shipped durations on synthetic series).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    POLL_INTERVAL_S,
    SIM_MODEL,
    Server,
    ServerStarter,
    draftgate_env,
    fleet_backend,
    free_port,
    gateway_env,
    sim_args,
    write_fleet,
)

ROOT = Path(__file__).parents[2]
RULES = ROOT / "deploy" / "compose" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "compose" / "grafana" / "dashboards" / "draftgate.json"
PROMETHEUS = shutil.which("prometheus")
ALERT_TIMEOUT_S = 60.0  # scrape, evaluate and `for:` take seconds; a busy machine, more
START_TIMEOUT_S = 60.0

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary (make test installs Debian's prometheus)"
)


def rules_for_the_test(path: Path) -> Path:
    """The shipped rules with every `for:` cut to one second, written to `path`."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def prometheus_config(gateway: Server, sims: dict[str, Server], rules: Path) -> dict[str, Any]:
    """Compose's two kinds of jobs (deploy/compose/prometheus.yml) on static loopback targets,
    scraped and evaluated every second."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "draftgate-gateway",
                "static_configs": [{"targets": [f"127.0.0.1:{gateway.port}"]}],
            },
            {
                "job_name": "vllm-sim",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{sim.port}"], "labels": {"backend": name}}
                    for name, sim in sims.items()
                ],
            },
        ],
    }


@dataclass
class Prometheus:
    """A running Prometheus on a loopback port, with its own storage."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    log_file: IO[bytes]

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def get(self, path: str, **params: str) -> Any:
        """The `data` of a Prometheus API answer."""
        answer = httpx.get(f"{self.base_url}{path}", params=params, timeout=5.0).json()
        assert answer["status"] == "success", answer
        return answer["data"]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts called `name`."""
        return [a for a in self.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Prometheus]]:
    """Start Prometheus on a config, on a free loopback port; wait until it is ready."""
    started: list[Prometheus] = []

    def start(config: dict[str, Any]) -> Prometheus:
        assert PROMETHEUS is not None
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        port, log_path = free_port(), tmp_path / "prometheus.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log_path, log_file)
        started.append(prometheus)
        until(lambda: _ready(prometheus), START_TIMEOUT_S, "Prometheus ready", prometheus)
        return prometheus

    try:
        yield start
    finally:
        for prometheus in started:
            prometheus.close()


def _ready(prometheus: Prometheus) -> bool:
    assert prometheus.process.poll() is None, prometheus.output()
    try:
        return httpx.get(f"{prometheus.base_url}/-/ready", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def until(condition: Callable[[], bool], timeout_s: float, what: str, prom: Prometheus) -> None:
    """Poll `condition` until it holds; fail naming `what`, with Prometheus's view."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            seen = prom.get("/api/v1/alerts") if prom.process.poll() is None else prom.output()
            pytest.fail(f"{what}: not within {timeout_s} s; alerts: {seen}")
        time.sleep(POLL_INTERVAL_S * 4)


def firing(prom: Prometheus, name: str, label: str) -> set[str]:
    """The `label` values of the firing alerts called `name`."""
    return {a["labels"][label] for a in prom.alerts(name) if a["state"] == "firing"}


def test_real_prometheus_fires_the_shipped_alerts(
    start_server: ServerStarter,
    start_prometheus: Callable[[dict[str, Any]], Prometheus],
    tmp_path: Path,
) -> None:
    fast, peagle = ("--time-scale", "20"), ("--method", "p-eagle", "--k", "7")
    sims = {
        "sim-plain": start_server(*sim_args(*fast), env=draftgate_env()),
        "sim-peagle": start_server(*sim_args(*peagle, *fast), env=draftgate_env()),
        # Runs P-EAGLE, registered as plain: its counters contradict its method.
        "sim-mislabelled": start_server(*sim_args(*peagle, *fast), env=draftgate_env()),
    }
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [
            fleet_backend("sim-plain", sims["sim-plain"].base_url),
            fleet_backend("sim-peagle", sims["sim-peagle"].base_url, "p-eagle"),
            fleet_backend("sim-mislabelled", sims["sim-mislabelled"].base_url),
        ],
    )
    # Probes time out after a second (the default tests' half second can take a backend
    # of a busy machine out for a moment, and that alert is watched here).
    env = gateway_env(
        f"sqlite:///{tmp_path}/draftgate.db",
        fleet,
        PROBE_INTERVAL_S="1",
        COLLECT_INTERVAL_S="0.5",
        SELECTOR_INTERVAL_S="1",
    )
    gateway = start_server("gateway", env=env)
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-12-01"}
    with gateway.client(ADMIN_TOKEN) as admin:
        assert admin.post("/admin/v1/prices", json=price).status_code == 201
    rules = rules_for_the_test(tmp_path / "alerts.yml")
    prom = start_prometheus(prometheus_config(gateway, sims, rules))

    # Every target is scraped and every rule evaluates without an error.
    shipped_rules = sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])

    def scraped_and_evaluated() -> bool:
        targets = prom.get("/api/v1/targets")["activeTargets"]
        groups = prom.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return (
            len(targets) == 4
            and all(t["health"] == "up" for t in targets)
            and len(rules) == shipped_rules
            and all(r["health"] == "ok" for r in rules)
        )

    until(scraped_and_evaluated, ALERT_TIMEOUT_S, "targets up and rules evaluated", prom)

    # The selector prices every method with a healthy backend beside plain: P-EAGLE, the
    # auto policy's choice, is the cheaper at this load.
    def priced(query: str) -> float | None:
        result = prom.get("/api/v1/query", query=query)["result"]
        return float(result[0]["value"][1]) if result else None

    peagle_usd = 'draftgate_method_usd_per_mtok{method="p-eagle"}'
    until(lambda: priced(peagle_usd) is not None, ALERT_TIMEOUT_S, "P-EAGLE priced", prom)
    peagle, plain = (
        priced(peagle_usd),
        priced('draftgate_method_plain_usd_per_mtok{method="p-eagle"}'),
    )
    assert peagle is not None
    assert plain is not None
    assert peagle < plain

    # Two requests, served by P-EAGLE, go to the ledger; the P-EAGLE server drafted, and
    # the gateway's collector publishes its acceptance length.
    chat = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hello"}]}
    for _ in range(2):
        answer = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=chat, timeout=30)
        answer.raise_for_status()
        assert answer.headers["x-draftgate-method"] == "p-eagle"

    def ledger_written() -> bool:
        result = prom.get("/api/v1/query", query="draftgate_ledger_written_total")["result"]
        return bool(result) and float(result[0]["value"][1]) == 2

    until(ledger_written, ALERT_TIMEOUT_S, "two usage records written", prom)

    def acceptance_scraped() -> bool:
        query = 'draftgate_backend_acceptance_length{backend="sim-peagle"}'
        result = prom.get("/api/v1/query", query=query)["result"]
        return bool(result) and float(result[0]["value"][1]) > 1

    until(acceptance_scraped, ALERT_TIMEOUT_S, "sim-peagle's acceptance length scraped", prom)

    until(
        lambda: firing(prom, "DraftgateMethodMismatch", "backend") == {"sim-mislabelled"},
        ALERT_TIMEOUT_S,
        "DraftgateMethodMismatch firing for sim-mislabelled alone",
        prom,
    )
    assert prom.alerts("DraftgateBackendDown") == []
    assert prom.get("/api/v1/query", query="draftgate_ready")["result"][0]["value"][1] == "1"

    sims["sim-peagle"].close()
    until(
        lambda: firing(prom, "DraftgateBackendDown", "backend") == {"sim-peagle"},
        ALERT_TIMEOUT_S,
        "DraftgateBackendDown firing for sim-peagle",
        prom,
    )
    # The other backends are up, so the replica stays ready; the ledger wrote everything;
    # the method that served is cheaper than plain at this load.
    assert {a["labels"]["backend"] for a in prom.alerts("DraftgateBackendDown")} == {"sim-peagle"}
    quiet = (
        "DraftgateGatewayNotReady",
        "DraftgateLedgerBacklog",
        "DraftgateLedgerDropped",
        "DraftgateLedgerRefused",
        "DraftgateMethodCostlierThanPlain",
    )
    for name in quiet:
        assert prom.alerts(name) == [], name

    sims["sim-plain"].close()
    sims["sim-mislabelled"].close()
    until(
        lambda: (
            firing(prom, "DraftgateGatewayNotReady", "instance") == {f"127.0.0.1:{gateway.port}"}
        ),
        ALERT_TIMEOUT_S,
        "DraftgateGatewayNotReady firing once no backend is healthy",
        prom,
    )

    # Grafana's queries run on this Prometheus, and its alerts panel lists what fires.
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for query in panel.get("targets", []):
            prom.get("/api/v1/query", query=query["expr"].replace("$__rate_interval", "10s"))
    [panel] = [p for p in dashboard["panels"] if p["title"] == "Alerts firing"]
    shown = prom.get("/api/v1/query", query=panel["targets"][0]["expr"])["result"]
    assert {"DraftgateBackendDown", "DraftgateGatewayNotReady"} <= {
        r["metric"]["alertname"] for r in shown
    }


def test_real_prometheus_fires_the_lossless_alert_only_for_the_lossy_method(
    start_server: ServerStarter,
    start_prometheus: Callable[[dict[str, Any]], Prometheus],
    tmp_path: Path,
) -> None:
    """The lossless watchdog replays every greedy answer of a DSpark simulator on plain:
    clean, 60 checks and no alert; told to diverge half its answers, the alert fires for
    DSpark alone (docs/lossless.md)."""
    fast = ("--time-scale", "20")
    sims = {
        "sim-plain": start_server(*sim_args(*fast), env=draftgate_env()),
        "sim-dspark": start_server(*sim_args("--method", "dspark", *fast), env=draftgate_env()),
    }
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [
            fleet_backend("sim-plain", sims["sim-plain"].base_url),
            fleet_backend("sim-dspark", sims["sim-dspark"].base_url, "dspark", k=5),
        ],
        [{"name": SIM_MODEL, "policy": {"mode": "pinned", "method": "dspark"}}],
    )
    env = gateway_env(
        f"sqlite:///{tmp_path}/draftgate.db",
        fleet,
        LOSSLESS_SAMPLE_SHARE="1",
        LOSSLESS_MAX_PER_MINUTE="10000",
        LOSSLESS_QUEUE="1000",
    )
    gateway = start_server("gateway", env=env)
    prom = start_prometheus(
        prometheus_config(gateway, sims, rules_for_the_test(tmp_path / "a.yml"))
    )
    checks = 'sum(draftgate_lossless_checks_total{method="dspark"})'

    def checked(n: int) -> bool:
        result = prom.get("/api/v1/query", query=checks)["result"]
        return bool(result) and float(result[0]["value"][1]) >= n

    def ask(n: int) -> None:
        for i in range(n):
            body = {
                "model": SIM_MODEL,
                "messages": [{"role": "user", "content": f"lossless {i} {time.monotonic()}"}],
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
            }
            answer = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30)
            answer.raise_for_status()

    ask(60)
    until(lambda: checked(60), ALERT_TIMEOUT_S, "60 clean checks scraped", prom)
    assert prom.alerts("DraftgateLosslessDivergence") == []
    faults = {"diverge_rate": 0.5, "diverge_at": 5}
    httpx.post(f"{sims['sim-dspark'].base_url}/sim/faults", json=faults).raise_for_status()
    ask(60)
    until(
        lambda: firing(prom, "DraftgateLosslessDivergence", "method") == {"dspark"},
        ALERT_TIMEOUT_S,
        "DraftgateLosslessDivergence firing for dspark",
        prom,
    )
    [alert] = prom.alerts("DraftgateLosslessDivergence")
    assert (alert["labels"]["model"], alert["labels"]["reference"]) == (SIM_MODEL, "plain")
