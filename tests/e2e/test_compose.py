"""The docker compose file and Dockerfile, checked offline (no Docker engine needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The parsed compose file."""
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def _host_ip(mapping: str | dict[str, Any]) -> str | None:
    """The host address of a short (`IP:HOST:CONTAINER`) or long port mapping."""
    if isinstance(mapping, dict):
        return mapping.get("host_ip")
    parts = str(mapping).split(":")
    return parts[0] if len(parts) == 3 else None


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else " ".join(value)


def test_compose_file_matches_the_compose_spec() -> None:
    result = subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_published_port_binds_loopback(compose: dict[str, Any]) -> None:
    mappings = [
        (name, mapping)
        for name, service in compose["services"].items()
        for mapping in service.get("ports", [])
    ]
    assert mappings, "the gateway publishes its port"
    for name, mapping in mappings:
        assert _host_ip(mapping) == "127.0.0.1", f"{name} publishes {mapping!r} beyond loopback"


def test_gateway_service_runs_the_gateway_and_checks_health(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    assert _text(gateway["command"]).startswith("draftgate gateway")
    assert "http://127.0.0.1:8080/health" in _text(gateway["healthcheck"]["test"])
    assert gateway["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "@postgres:5432/" in gateway["environment"]["DRAFTGATE_DATABASE_URL"]
    assert "pg_isready" in _text(compose["services"]["postgres"]["healthcheck"]["test"])


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each Dockerfile instruction, continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    pairs = [line.split(maxsplit=1) for line in lines if line and not line.startswith("#")]
    return [(keyword.upper(), args) for keyword, args in pairs]


def test_dockerfile_runs_gateway_as_non_root_with_healthcheck() -> None:
    instructions = _dockerfile_instructions()
    last = dict(instructions)  # the final stage's value wins, as in Docker
    assert instructions[0] == ("FROM", "python:3.11-slim AS build")
    assert last["FROM"] == "python:3.11-slim"
    assert last["USER"] not in {"root", "0"}
    assert last["EXPOSE"] == "8080"
    assert last["CMD"] == '["draftgate", "gateway", "--host", "0.0.0.0"]'
    assert "/health" in last["HEALTHCHECK"]
    assert "urllib" in last["HEALTHCHECK"]
