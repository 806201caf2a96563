"""Shared fixtures: a fresh database on SQLite and on the real PostgreSQL for every test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.settings import Settings

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
READ_TOKEN = "test-read-token-0123456789abcdef"
# The machine's PostgreSQL (trust auth); each test gets a schema of its own in it.
POSTGRES_URL = os.environ.get(
    "DRAFTGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _postgres_schema_url(schema: str) -> str:
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"


@contextmanager
def new_postgres_schema() -> Iterator[str]:
    """An empty PostgreSQL schema, dropped afterwards; the URL that selects it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield _postgres_schema_url(schema)
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    """An empty PostgreSQL schema, dropped afterwards; the URL that selects it."""
    with new_postgres_schema() as url:
        yield url


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """An empty database: a SQLite file, or a fresh schema in the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/draftgate.db"
    url: str = request.getfixturevalue("postgres_schema")
    return url


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Settings for a gateway on the test database."""
    return Settings(database_url=database_url, admin_token=ADMIN_TOKEN, admin_read_token=READ_TOKEN)


@asynccontextmanager
async def admin_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process gateway on `settings` (lifespan running) and a client of it carrying
    the admin token: for tests that need settings of their own."""
    application = create_app(settings)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        application.router.lifespan_context(application),
        httpx.AsyncClient(
            # localhost: a keyless gateway answers only the hosts it lists
            transport=httpx.ASGITransport(app=application),
            base_url="http://localhost",
            headers=headers,
        ) as client,
    ):
        yield client


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The gateway app with its lifespan running (migrations applied)."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client carrying the admin token."""
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://gateway.test", headers=headers
    ) as http:
        yield http
