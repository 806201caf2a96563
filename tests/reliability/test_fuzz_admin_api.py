"""Schemathesis against the admin API of a real gateway process: generated requests, valid and
invalid, from the app's own /openapi.json; no 5xx, and every response (errors included) is
documented and matches its declared schema."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, GenerationMode, checks
from schemathesis.generation.case import Case

from tests.conftest import DATABASES, POSTGRES_URL
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    Server,
    closed_url,
    fleet_backend,
    gateway_env,
    spawn_server,
    write_fleet,
)

# Per operation, mode (valid, invalid) and database: about 420 requests each. A longer run:
# FUZZ_SCALE=20 pytest tests/reliability/test_fuzz_admin_api.py
EXAMPLES = 8 * int(os.environ.get("FUZZ_SCALE", "1"))
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@dataclass
class Admin:
    """The gateway under test and its database."""

    gateway: Server
    database_url: str


@pytest.fixture(scope="module", params=DATABASES)
def admin(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Admin]:
    """A gateway whose only backend is down (benchmark runs fail fast, nothing is proxied), on
    a SQLite file or a fresh schema of the real PostgreSQL."""
    log_dir = tmp_path_factory.mktemp("fuzzed")
    schema = f"fuzz_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        database_url = f"sqlite:///{log_dir}/draftgate.db"
    else:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        database_url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    fleet = write_fleet(log_dir / "fleet.yaml", [fleet_backend("seed", closed_url())])
    env = gateway_env(database_url, fleet, LOG_LEVEL="warning")
    gateway = spawn_server(("gateway",), env, log_dir)
    try:
        gateway.wait_healthy()
        yield Admin(gateway, database_url)
        assert gateway.process.poll() is None
        assert "Traceback" not in gateway.output(), gateway.output()[-3000:]
    finally:
        gateway.close()
        if request.param != "sqlite":
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def admin_operations(base_url: str) -> list[APIOperation]:
    """Every /admin operation of the app's OpenAPI document."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    return [r.ok() for r in schema.include(path_regex="^/admin/").get_all_operations()]


def can_be_invalid(operation: APIOperation) -> bool:
    """Whether a request can break the schema: a body, or a parameter that is not any string."""
    parameters = [*operation.path_parameters, *operation.query]
    typed = [p.definition.get("schema", {}).get("type") for p in parameters]
    return bool(len(operation.body)) or any(t not in (None, "string") for t in typed)


def fuzz(
    operation: APIOperation, base_url: str, mode: GenerationMode, examples: int, seen: Counter[str]
) -> None:
    """Call `operation` with generated cases of `mode`; every check must pass."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def run(case: Case) -> None:
        response = case.call_and_validate(
            base_url=base_url, headers=AUTH, checks=CHECKS, timeout=30
        )
        seen[f"{response.status_code // 100}xx"] += 1

    run()


def test_admin_api_conforms_to_its_openapi(admin: Admin) -> None:
    operations = admin_operations(admin.gateway.base_url)
    assert len(operations) >= 30
    failures, seen = {}, Counter[str]()
    for operation in operations:
        modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
        for mode in modes if can_be_invalid(operation) else modes[:1]:
            try:
                fuzz(operation, admin.gateway.base_url, mode, EXAMPLES, seen)
            except Unsatisfiable:  # nothing of this operation can be made invalid
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # report every operation's failure
                failures[f"{operation.label} ({mode.value})"] = f"{type(exc).__name__}: {exc}"[
                    :2000
                ]
    print(f"\nadmin API fuzzing: {sum(seen.values())} requests, by status class {dict(seen)}")
    assert seen["4xx"]
    assert seen["2xx"]
    assert failures == {}, "\n\n".join(f"{k}\n{v}" for k, v in failures.items())
