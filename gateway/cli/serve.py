"""Serving a gateway process: uvicorn's settings, worker processes, signals, open-file limits."""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import signal
import socket
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
import uvicorn

from gateway.cli.common import LOG_FORMAT, fail
from gateway.server.private import UnsafeDirectory, private_directory
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.app import GatewayApp
    from gateway.control.managed import ManagedBackends
    from gateway.server.replica import Replica

Port = Annotated[int, typer.Option(min=1, max=65535)]
OPEN_FILES_WITHOUT_HARD_LIMIT = 1_048_576  # what to ask for when the hard limit is unlimited


def exit_zero(signum: int, frame: FrameType | None) -> NoReturn:
    """A signal handler exiting cleanly (status 0)."""
    raise SystemExit(0)


def _raise_open_files_limit() -> None:
    """Lift the soft limit on open files to the hard one: each stream holds two sockets (the
    client's, the backend's), and the usual soft limit of 1024 would cut a replica off near
    500 streams while the hard limit allows far more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WITHOUT_HARD_LIMIT)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        logging.getLogger(__name__).warning("open-file limit stays %d: %s", soft, exc)
        return
    logging.getLogger(__name__).info("open-file limit raised from %d to %d", soft, wanted)


def serve(
    settings: Settings, managed: ManagedBackends | None = None, log_file: Path | None = None
) -> None:
    """Run the gateway until stopped: in this process, or in `settings.workers` workers."""
    from gateway.app import create_app
    from gateway.server.workers import run_workers

    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the previous
    # handler; without this one the process would die by the signal (exit 143) after a clean stop.
    signal.signal(signal.SIGTERM, exit_zero)

    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    _raise_open_files_limit()
    if log_file is not None:  # beside the backends' logs; the terminal keeps its copy
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per upstream request
    if settings.workers == 1 or managed is not None:  # managed backends live in this process
        _run_server(server_config(settings, create_app(settings, managed)))
        return

    if settings.worker_state_dir is not None:  # refused before anything else is done
        try:
            private_directory(settings.worker_state_dir)
        except UnsafeDirectory as exc:
            fail(f"DRAFTGATE_WORKER_STATE_DIR: {exc}")
    _prepare_database_once(settings)
    prepared = settings.model_copy(update={"migrate_on_start": False, "fleet": None})

    def serve_worker(sock: socket.socket, replica: Replica) -> None:
        signal.signal(signal.SIGTERM, exit_zero)  # as above, in the worker
        _run_server(server_config(prepared, create_app(prepared, replica=replica)), sock)

    run_workers(
        settings.workers, settings.host, settings.port, settings.worker_state_dir, serve_worker
    )


def _run_server(config: uvicorn.Config, sock: socket.socket | None = None) -> None:
    """Serve until stopped. uvicorn re-raises Ctrl-C once it has stopped gracefully; as
    `uvicorn.run` does, that is a clean exit."""
    with contextlib.suppress(KeyboardInterrupt):
        Server(config).run(sockets=None if sock is None else [sock])


class Server(uvicorn.Server):
    """uvicorn's server, freezing the heap once the app has started.

    What the process holds by then (modules, the app, its routes, schemas, engine and
    registry) lives as long as it does. Frozen out of the garbage collector's reach, a full
    collection walks only what serving made since: a pause of milliseconds, not the 80-140
    ms for which it stalled the event loop and every stream in flight (bench/README.md)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        gc.collect()
        gc.freeze()


def _prepare_database_once(settings: Settings) -> None:
    """Migrate and apply the fleet file before the workers start, not once in each."""
    from gateway.app import prepare_database
    from gateway.db.session import make_engine

    engine = make_engine(settings.database_url)
    try:
        prepare_database(settings, engine)
    finally:
        engine.dispose()  # no connection crosses the fork


def server_config(settings: Settings, app: GatewayApp) -> uvicorn.Config:
    """uvicorn's settings for a gateway process."""
    from gateway.server.http_limits import RequestLimits, protocol_with

    limits = RequestLimits(
        settings.max_header_bytes,
        settings.max_header_count,
        settings.request_read_timeout_s,
        settings.client_write_timeout_s,
        settings.client_send_buffer_bytes,
    )
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers propagate to the handlers set up above
        access_log=False,
        http=protocol_with(limits),
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
    )
