"""The gateway application: `create_app(settings)` and its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from gateway import health
from gateway.admin import admin_router
from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.deps import Services
from gateway.errors import ServiceUnavailable, install_error_handlers
from gateway.fleet import apply_fleet, load_fleet
from gateway.settings import Settings

logger = logging.getLogger(__name__)
VERSION = "0.1.0"


def prepare_database(settings: Settings, engine: Engine) -> None:
    """Bring the schema to head (if configured) and apply the fleet file (if any)."""
    if settings.migrate_on_start:
        migrate.upgrade(engine)
    if settings.fleet is not None:
        fleet = load_fleet(settings.fleet)
        with transaction(make_sessionmaker(engine)) as session:
            apply_fleet(session, fleet)
        logger.info("applied fleet file %s", settings.fleet)


async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
    logger.warning("database unavailable: %s", type(exc).__name__)
    error = ServiceUnavailable("database unavailable; retry shortly")
    return JSONResponse(error.envelope(), status_code=error.status_code)


def create_app(settings: Settings) -> FastAPI:
    """Build the gateway: health, and the admin API behind the admin token."""
    if settings.admin_token is None:
        raise ValueError("settings.admin_token is required (DRAFTGATE_ADMIN_TOKEN)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        try:
            await anyio.to_thread.run_sync(prepare_database, settings, engine)
            app.state.services = Services(settings, engine, make_sessionmaker(engine))
            yield
        finally:
            engine.dispose()

    app = FastAPI(title="draftgate", version=VERSION, lifespan=lifespan)
    install_error_handlers(app)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.include_router(health.router)
    app.include_router(admin_router())
    return app
