"""The dashboard forwards the person a login proxy signed in with each change it makes (the
gateway's audit log names them: tests/api/test_audit_actors.py), and only with changes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dashboard.client import AdminClient, signed_in_person
from tests.webhook_receiver import Receiver

HEADER = "x-forwarded-user"


@pytest.fixture
def gateway() -> Iterator[Receiver]:
    """A stand-in for the gateway's admin API that records each request."""
    receiver = Receiver("unused-secret").start()
    try:
        yield receiver
    finally:
        receiver.close()


def test_a_change_carries_the_signed_in_person(gateway: Receiver) -> None:
    base_url = gateway.url.removesuffix("/hooks/draftgate")
    api = AdminClient(base_url, "a-token", person={HEADER: "alice@example.com"})
    api._write("POST", "/teams", {"name": "search"})
    [request] = gateway.received
    assert request.path == "/admin/v1/teams"
    assert request.headers[HEADER] == "alice@example.com"
    assert request.headers["authorization"] == "Bearer a-token"


def test_outside_a_page_run_no_person_is_forwarded() -> None:
    assert signed_in_person(HEADER) == {}
    assert signed_in_person("") == {}
