"""GET /admin/v1/measurements: stored measurements, newest first, with filters."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from gateway.db.session import transaction
from gateway.db.tables import Measurement
from tests.api.test_admin_backends import assert_envelope


def _store(app: FastAPI, *rows: Measurement) -> None:
    with transaction(app.state.components.sessions) as session:
        session.add_all(rows)


def _point(method: str, c: float, source: str, backend: str | None) -> Measurement:
    return Measurement(
        model="openai/gpt-oss-20b",
        method=method,
        k=3,
        gpu_type="B200",
        concurrency=c,
        output_tokens_per_s=100.0 * c,
        source=source,
        mean_acceptance_length=2.5 if method != "plain" else None,
        acceptance_per_position=[0.8, 0.5, 0.2] if method != "plain" else None,
        backend_name=backend,
    )


async def test_measurements_newest_first_and_filtered(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    assert (await client.get("/admin/v1/measurements")).json()["data"] == []
    _store(
        app,
        _point("plain", 1, "bench", "b-plain"),
        _point("eagle3", 4, "scrape", "b-e3"),
        _point("eagle3", 16, "import", None),
    )
    listed = (await client.get("/admin/v1/measurements")).json()["data"]
    assert [(m["method"], m["concurrency"], m["source"]) for m in listed] == [
        ("eagle3", 16, "import"),
        ("eagle3", 4, "scrape"),
        ("plain", 1, "bench"),
    ]
    assert listed[1]["mean_acceptance_length"] == 2.5
    assert listed[1]["acceptance_per_position"] == [0.8, 0.5, 0.2]
    assert listed[1]["output_tokens_per_s"] == 400.0
    assert listed[1]["measured_at"]

    by_backend = await client.get("/admin/v1/measurements", params={"backend": "b-e3"})
    assert [m["backend_name"] for m in by_backend.json()["data"]] == ["b-e3"]
    by_source = await client.get("/admin/v1/measurements", params={"source": "bench"})
    assert [m["method"] for m in by_source.json()["data"]] == ["plain"]
    other = await client.get("/admin/v1/measurements", params={"model": "other/model"})
    assert other.json()["data"] == []
    one = await client.get("/admin/v1/measurements", params={"limit": 1})
    assert [m["concurrency"] for m in one.json()["data"]] == [16]


async def test_measurements_reject_a_bad_limit(client: httpx.AsyncClient) -> None:
    for limit in ("0", "1001", "many"):
        response = await client.get("/admin/v1/measurements", params={"limit": limit})
        assert_envelope(response, 422, "limit")


async def test_measurements_filters_with_odd_text_are_answered(client: httpx.AsyncClient) -> None:
    for value in ("\x00", "é/ü", "x" * 500):
        for name in ("model", "backend", "source"):
            response = await client.get("/admin/v1/measurements", params={name: value})
            assert response.status_code in {200, 422}, (name, value, response.text)
            if response.status_code == 200:
                assert response.json()["data"] == []
            else:
                assert_envelope(response, 422)  # text the database cannot hold
