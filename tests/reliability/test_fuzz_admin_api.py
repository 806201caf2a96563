"""Schemathesis against the admin API of a real gateway process: generated requests, valid and
invalid, from the app's own /openapi.json; no 5xx, and every response (errors included) is
documented and matches its declared schema."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, GenerationMode, checks
from schemathesis.generation.case import Case

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    ModuleGatewayStarter,
    Server,
    closed_url,
    fleet_backend,
    start_module_gateway,  # noqa: F401  (a fixture, found by its import here)
)

EXAMPLES = 15  # per operation and mode (valid, invalid): about 1200 requests in all
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


@pytest.fixture(scope="module")
def admin(start_module_gateway: ModuleGatewayStarter) -> Iterator[Admin]:  # noqa: F811
    """A gateway whose only backend is down: benchmark runs fail fast, nothing is proxied."""
    gateway, database_url = start_module_gateway(
        [fleet_backend("seed", closed_url())], LOG_LEVEL="warning"
    )
    yield Admin(gateway, database_url)
    assert gateway.process.poll() is None
    assert "Traceback" not in gateway.output(), gateway.output()[-3000:]


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
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)  # fmt: skip
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
