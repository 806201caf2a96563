"""deploy/compose/alerts.yml: valid for promtool, each alert tested firing and quiet on
synthetic series (tests/unit/alerts_test.yml), reading only metrics the gateway exports,
and documented in docs/alerts.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.metrics import GatewayMetrics

ROOT = Path(__file__).parents[2]
RULES = ROOT / "deploy" / "compose" / "alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")
DOC = ROOT / "docs" / "alerts.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool (make test installs Debian's prometheus)"
)
# Prometheus's own series, which the rules may read beside the gateway's.
PROMETHEUS_SERIES = {"up"}


def alerting_rules() -> list[dict[str, Any]]:
    """Every rule of the shipped file."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def exported_metric_names() -> set[str]:
    """Every series name the gateway's /metrics can carry (counters with `_total`,
    histograms with their `_bucket`, `_sum` and `_count`)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix
        for family in GatewayMetrics().registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (the identifiers before a selector or a
    range, not functions, keywords or label names)."""
    selectors = re.sub(r"\{[^}]*\}", "", expr)  # label matchers and their strings
    clauses = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", selectors
    )
    names = set(re.findall(r"\b([a-z_:][a-z0-9_:]*)\b(?!\s*\()", clauses))  # not a call
    return names - {"and", "or", "unless", "offset", "bool", "group_left", "group_right"}


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerting_rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass() -> None:
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(UNIT_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_each_alert_has_a_firing_and_a_quiet_case() -> None:
    document = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    assert document["rule_files"] == ["../../deploy/compose/alerts.yml"]  # the shipped file
    cases = [case for test in document["tests"] for case in test["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    names = {rule["alert"] for rule in alerting_rules()}
    assert fires == quiet == names


def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook() -> None:
    rules = alerting_rules()
    assert len(rules) == len({r["alert"] for r in rules}) == 12
    for rule in rules:
        assert rule["alert"].startswith("Draftgate"), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]
        assert "\n" not in rule["annotations"]["runbook"], rule["alert"]  # one line


def test_the_rules_read_only_metrics_the_gateway_exports() -> None:
    exported = exported_metric_names()
    assert {"draftgate_requests_total", "draftgate_backend_healthy"} <= exported
    read = set().union(*(metric_names(rule["expr"]) for rule in alerting_rules()))
    assert "draftgate_backend_acceptance_length" in read
    assert read - PROMETHEUS_SERIES <= exported, read - PROMETHEUS_SERIES - exported
    assert metric_names('sum by (le) (rate(a_total{x="y"}[5m])) > on (m) b offset 1h') == {
        "a_total",
        "b",
    }


def _words(text: str) -> str:
    return " ".join(text.split())


def test_docs_give_each_alert_its_expression_duration_and_runbook() -> None:
    page = DOC.read_text(encoding="utf-8")
    for rule in alerting_rules():
        heading = f"### `{rule['alert']}`"
        assert heading in page, heading
        section = _words(page.split(heading, 1)[1].split("\n### ", 1)[0])
        assert _words(rule["expr"]) in section, rule["alert"]
        assert f"For {rule.get('for', '0s')}, severity `{rule['labels']['severity']}`" in section
        assert f"**Runbook:** {_words(rule['annotations']['runbook'])}" in section, rule["alert"]
