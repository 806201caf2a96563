"""Helpers shared by the `draftgate` sub-commands: failing cleanly, settings, a session."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import typer
from pydantic import ValidationError

from gateway.db.sealed import use_keys
from gateway.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

CLI_ACTOR = "cli"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# The modules each optional extra of pyproject.toml brings (a test holds them together).
EXTRA_MODULES = {"tiny-models": frozenset({"numpy", "safetensors", "tokenizers"})}


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"draftgate: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def extra_required(extra: str) -> Iterator[None]:
    """Imports inside fail as one line naming the extra to install, not a traceback."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name not in EXTRA_MODULES[extra]:
            raise
        fail(
            f"this command needs the {extra} extra ({exc.name} is not installed): "
            f"pip install 'draftgate[{extra}]'"
        )


def settings_from_env(**overrides: object) -> Settings:
    """Settings from the environment, with command-line overrides; exit 2 when invalid."""
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        fail("invalid settings: " + "; ".join(str(e["msg"]) for e in exc.errors()))
    use_keys(settings.secrets_keys())  # what this command stores of backend keys is sealed
    return settings


@contextmanager
def session() -> Iterator[Session]:
    """A transaction on the migrated database of the current settings."""
    from gateway.db import migrate
    from gateway.db.session import make_engine, make_sessionmaker, transaction

    engine = make_engine(settings_from_env().database_url)
    try:
        migrate.upgrade(engine)
        with transaction(make_sessionmaker(engine)) as session:
            yield session
    finally:
        engine.dispose()
