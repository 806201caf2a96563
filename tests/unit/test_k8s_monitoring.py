"""deploy/k8s/overlays/monitoring, checked offline: the base plus ServiceMonitors and a
PrometheusRule for the Prometheus operator. Custom resources have no schema in the
Kubernetes validator, so each is validated against the operator's own CRD schema
(tests/fixtures/crds: prometheus-operator v0.93.0's, Apache-2.0), strictly: a field the
schema does not declare is refused, as `kubectl apply --validate=strict` refuses it. The
ServiceMonitors scrape what compose's Prometheus scrapes; the PrometheusRule holds exactly
the groups of deploy/compose/alerts.yml."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml

from tests.unit.k8s_queries import BASE, MONITORING, ROOT, selects
from tests.unit.kustomize_build import Build, Manifest, build, load_manifests

CRDS = ROOT / "tests" / "fixtures" / "crds"
RULES = ROOT / "deploy" / "compose" / "alerts.yml"
COMPOSE_PROMETHEUS = ROOT / "deploy" / "compose" / "prometheus.yml"
CUSTOM_KINDS = ("ServiceMonitor", "PrometheusRule")
METADATA_KEYS = {"name", "namespace", "labels", "annotations"}


@pytest.fixture(scope="module")
def monitoring() -> Build:
    return build(MONITORING)


def _strict(schema: Any) -> Any:
    """The schema refusing undeclared fields wherever it declares fields and keeps none."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k != "properties" else v for k, v in schema.items()}
    if isinstance(schema.get("pattern"), str):  # Go's regexp takes a flag mid-pattern
        out["pattern"] = schema["pattern"].replace("^(?i)", "(?i)^")
    if "properties" in schema:
        out["properties"] = {name: _strict(s) for name, s in schema["properties"].items()}
        keeps = (
            schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
        )
        if not keeps:
            out["additionalProperties"] = False
    return out


@cache
def crd(kind: str) -> tuple[str, dict[str, Any]]:
    """(apiVersion, strict schema) of the operator's served, stored version of `kind`."""
    for path in sorted(CRDS.glob("*.yaml")):
        [definition] = load_manifests(path)
        if definition["spec"]["names"]["kind"] == kind:
            [version] = [v for v in definition["spec"]["versions"] if v["storage"]]
            assert version["served"], kind
            schema = _strict(version["schema"]["openAPIV3Schema"])
            jsonschema.Draft4Validator.check_schema(schema)
            return f"{definition['spec']['group']}/{version['name']}", schema
    raise AssertionError(f"no CRD of kind {kind} in {CRDS}")


def validate_custom_resource(obj: Manifest) -> None:
    """Raise jsonschema.ValidationError unless `obj` is what its CRD admits."""
    api_version, schema = crd(obj["kind"])
    if obj["apiVersion"] != api_version:
        raise jsonschema.ValidationError(f"apiVersion {obj['apiVersion']}, not {api_version}")
    metadata = obj["metadata"]
    if not set(metadata) <= METADATA_KEYS or not isinstance(metadata.get("name"), str):
        raise jsonschema.ValidationError(f"metadata {metadata}")
    jsonschema.Draft4Validator(schema).validate(obj)


def test_the_overlay_is_the_base_with_service_monitors_and_a_prometheus_rule(
    monitoring: Build,
) -> None:
    base = build(BASE)
    others = [o for o in monitoring.objects if o["kind"] not in CUSTOM_KINDS]
    assert sorted(others, key=str) == sorted(base.objects, key=str)  # the base, unchanged
    kinds = sorted(o["kind"] for o in monitoring.objects if o["kind"] in CUSTOM_KINDS)
    assert kinds == ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]


def test_each_custom_resource_validates_against_the_operators_crd(monitoring: Build) -> None:
    custom = [o for o in monitoring.objects if o["kind"] in CUSTOM_KINDS]
    assert len(custom) == 3
    for obj in custom:
        validate_custom_resource(obj)
        assert obj["metadata"]["namespace"] == "draftgate"


def test_the_crd_check_refuses_what_the_operator_would(monitoring: Build) -> None:
    gateway = monitoring.named("ServiceMonitor", "draftgate-gateway")
    rule = monitoring.named("PrometheusRule", "draftgate")
    misspelt, bad_interval, no_endpoints, no_expr, wrong_group = (
        copy.deepcopy(o) for o in (gateway, gateway, gateway, rule, gateway)
    )
    misspelt["spec"]["endpoints"][0]["paht"] = "/metrics"
    bad_interval["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    del no_endpoints["spec"]["endpoints"]
    del no_expr["spec"]["groups"][0]["rules"][0]["expr"]
    wrong_group["apiVersion"] = "monitoring.coreos.com/v1alpha1"
    for broken in (misspelt, bad_interval, no_endpoints, no_expr, wrong_group):
        with pytest.raises(jsonschema.ValidationError):
            validate_custom_resource(broken)


def _selected_services(result: Build, monitor: Manifest) -> list[Manifest]:
    namespace = monitor["metadata"]["namespace"]
    return [
        s
        for s in result.of_kind("Service")
        if s["metadata"]["namespace"] == namespace
        and selects(monitor["spec"]["selector"], s["metadata"].get("labels", {}))
    ]


def test_service_monitors_scrape_every_annotated_pod_on_its_declared_port(
    monitoring: Build,
) -> None:
    """The pods that carry prometheus.io/scrape (the gateway and every backend) are what
    the ServiceMonitors reach: through each Service selecting them, on a port it names."""
    scraped: set[str] = set()
    for monitor in monitoring.of_kind("ServiceMonitor"):
        services = _selected_services(monitoring, monitor)
        assert services, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for service in services:
            ports = {p["name"] for p in service["spec"]["ports"]}
            for endpoint in monitor["spec"]["endpoints"]:
                assert endpoint["port"] in ports, (monitor["metadata"]["name"], ports)
                assert endpoint["path"] == "/metrics"
            scraped.add(service["metadata"]["name"])
    annotated = {
        d["metadata"]["name"]
        for d in monitoring.of_kind("Deployment")
        if d["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape")
    }
    assert len(annotated) == 1 + 5
    fronting = {
        s["metadata"]["name"]
        for s in monitoring.of_kind("Service")
        for d in monitoring.of_kind("Deployment")
        if d["metadata"]["name"] in annotated
        and s["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    }
    assert scraped == fronting


def test_targets_carry_the_labels_compose_gives_them(monitoring: Build) -> None:
    """The gateway's job is its Service's name, the one compose names its job and the
    not-ready alert reads; a backend's series are labelled `backend`, as in compose."""
    compose = yaml.safe_load(COMPOSE_PROMETHEUS.read_text(encoding="utf-8"))
    jobs = {job["job_name"] for job in compose["scrape_configs"]}
    gateway = monitoring.named("ServiceMonitor", "draftgate-gateway")
    assert "jobLabel" not in gateway["spec"]
    [service] = _selected_services(monitoring, gateway)
    assert service["metadata"]["name"] in jobs
    assert f'up{{job="{service["metadata"]["name"]}"}}' in RULES.read_text(encoding="utf-8")
    [endpoint] = monitoring.named("ServiceMonitor", "vllm")["spec"]["endpoints"]
    backend = {"sourceLabels": ["__meta_kubernetes_service_name"], "targetLabel": "backend"}
    assert backend in endpoint["relabelings"]
    assert all(
        {"source_labels": ["__meta_dns_name"], "target_label": "backend"} in job["relabel_configs"]
        for job in compose["scrape_configs"]
        if job["job_name"].startswith("vllm-")
    )


def test_the_prometheus_rule_holds_exactly_the_shipped_rules(monitoring: Build) -> None:
    rule = monitoring.named("PrometheusRule", "draftgate")
    shipped = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert rule["spec"] == shipped, (
        "deploy/k8s/overlays/monitoring/prometheusrule.yaml differs from "
        "deploy/compose/alerts.yml: copy alerts.yml's groups under its `spec:`"
    )
