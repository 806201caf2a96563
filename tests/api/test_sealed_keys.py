"""Backend API keys sealed in the database, on SQLite and PostgreSQL: a dump alone does not
reveal them; keys stored before a secrets key was set, or under an older one, are sealed
again under the first at start; a sealed key no configured key opens is a clear error."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select

from gateway.db import migrate
from gateway.db.sealed import PREFIX, SealedWithoutKey, new_key, use_keys
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.db.tables import Backend
from gateway.schemas.resources import BackendCreate, PoolCreate
from gateway.services import pools
from gateway.services.backends import create_backend
from gateway.services.sealing import seal_stored_keys, unsealed_keys
from tests.e2e.conftest import query_rows, sqlalchemy_url

SECRET = "sk-backend-0123456789abcdef"
POOLED = "sk-pool-fedcba9876543210"
OLD, NEW = new_key(), new_key()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    found = make_engine(sqlalchemy_url(database_url))
    migrate.upgrade(found)
    yield found
    found.dispose()
    use_keys([])  # the process's keys, as the next test expects them: none


def _store(engine: Engine) -> None:
    backend = BackendCreate(
        name="keyed", url="http://127.0.0.1:9", model="m", method="plain", gpu_type="B200",
        api_key=SECRET,
    )  # fmt: skip
    pool = PoolCreate.model_validate({
        "name": "pooled", "discovery": {"dns": "vllm.serving.invalid"},
        "backend": {"model": "m", "method": "plain", "gpu_type": "B200", "api_key": POOLED},
    })  # fmt: skip
    with transaction(make_sessionmaker(engine)) as session:
        create_backend(session, backend, "test")
        pools.apply_pool(session, pool, "test")


def _stored(database_url: str) -> tuple[str, str]:
    """The backend's and the pool template's key as the database holds them."""
    backend = query_rows(database_url, "SELECT api_key FROM backends WHERE name = 'keyed'")
    pool = query_rows(database_url, "SELECT template FROM pools WHERE name = 'pooled'")
    template = pool[0]["template"]
    if isinstance(template, str):  # SQLite hands JSON back as text
        template = json.loads(template)
    return backend[0]["api_key"], template["api_key"]


def _read(engine: Engine) -> tuple[str | None, str | None]:
    """The keys as the gateway reads them."""
    with transaction(make_sessionmaker(engine)) as session:
        backend = session.scalar(select(Backend.api_key).where(Backend.name == "keyed"))
        return backend, pools.pools(session)[0].backend.api_key


def test_keys_are_stored_sealed_and_read_whole(engine: Engine, database_url: str) -> None:
    use_keys([NEW])
    _store(engine)
    for stored in _stored(database_url):
        assert stored.startswith(PREFIX)
        assert SECRET not in stored
        assert POOLED not in stored
    assert _read(engine) == (SECRET, POOLED)


def test_keys_stored_before_a_key_or_under_an_old_one_are_sealed_again_at_start(
    engine: Engine, database_url: str
) -> None:
    use_keys([])  # as before this change: stored as given
    _store(engine)
    assert _stored(database_url) == (SECRET, POOLED)
    with transaction(make_sessionmaker(engine)) as session:
        assert unsealed_keys(session) == 1  # what the start-up warning counts
    use_keys([OLD])
    with transaction(make_sessionmaker(engine)) as session:
        assert seal_stored_keys(session) == 2
    under_old = _stored(database_url)
    assert all(s.startswith(PREFIX) for s in under_old)
    use_keys([NEW, OLD])  # rotating: the new one seals, the old one still opens
    assert _read(engine) == (SECRET, POOLED)
    with transaction(make_sessionmaker(engine)) as session:
        assert seal_stored_keys(session) == 2
        assert seal_stored_keys(session) == 0  # once
    use_keys([NEW])  # the old key retired: everything opens under the new one alone
    assert _read(engine) == (SECRET, POOLED)
    assert _stored(database_url) != under_old


def test_a_sealed_key_without_its_key_is_a_clear_error(engine: Engine) -> None:
    use_keys([OLD])
    _store(engine)
    use_keys([])
    with pytest.raises(SealedWithoutKey, match="no DRAFTGATE_SECRETS_KEY"):
        _read(engine)
    with transaction(make_sessionmaker(engine)) as session, pytest.raises(SealedWithoutKey):
        seal_stored_keys(session)  # at start, before the gateway serves
    use_keys([NEW])
    with pytest.raises(SealedWithoutKey, match="not among DRAFTGATE_SECRETS_KEY's"):
        _read(engine)
