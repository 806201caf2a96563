"""Worker processes: N gateway processes serving one listening socket.

The supervisor (this module, in the process `draftgate gateway --workers N` starts) binds the
socket, then forks N workers that each run a whole gateway on it (gateway/server/replica.py says
what they share and which of them leads). It does nothing else: no event loop, no database,
no thread, so forking it is safe. A worker that dies is started again in its slot (after
`RESTART_BACKOFF_S` if it died that soon after its start, so a crashing worker does not
spin). A worker that could not start (uvicorn's exit status 3: its app's start-up failed)
stops the replica with that status, as one process would, for its orchestrator to see and
restart. SIGTERM or SIGINT stops every worker gracefully, each within
`shutdown_grace_s`, and then the supervisor. Each worker runs in a process group of its own,
so a terminal's Ctrl-C reaches the supervisor alone and each worker is told to stop once,
and each is told by the kernel (PR_SET_PDEATHSIG) if the supervisor dies without telling it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prometheus_client import values
from prometheus_client.multiprocess import mark_process_dead
from uvicorn.config import STARTUP_FAILURE

from gateway.server.inflight import INFLIGHT_FILE
from gateway.server.private import private_directory
from gateway.server.replica import CHOICES_FILE, GAUGES_FILE, LOCK_FILE, METRICS_DIR, Replica
from gateway.server.shared_budget import BUDGETS_FILE

logger = logging.getLogger(__name__)
LISTEN_BACKLOG = 2048  # uvicorn's default
RESTART_BACKOFF_S = 1.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h

ServeWorker = Callable[[socket.socket, Replica], None]


def listen(host: str, port: int) -> socket.socket:
    """The listening socket every worker accepts on (inherited across fork)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def prepare_state_dir(directory: Path | None) -> tuple[Path, bool]:
    """The workers' shared directory, without a previous run's files; True when it is a new
    temporary one (removed at exit). A given one must be this user's alone (UnsafeDirectory)."""
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="draftgate-workers-")), True  # made 0700
    private_directory(directory)
    shutil.rmtree(directory / METRICS_DIR, ignore_errors=True)  # a dead run's counts
    for name in (CHOICES_FILE, GAUGES_FILE, LOCK_FILE, INFLIGHT_FILE, BUDGETS_FILE):
        (directory / name).unlink(missing_ok=True)
    for stale in [*directory.glob("change.*"), *directory.glob("ack.*")]:
        stale.unlink()
    return directory, False


@dataclass
class Supervisor:
    """Forks `count` workers onto `sock`, keeps them running, stops them on a signal."""

    count: int
    sock: socket.socket
    directory: Path
    serve: ServeWorker
    children: dict[int, tuple[int, float]] = field(default_factory=dict)  # pid: slot, start
    stopping: bool = False
    failed: bool = False  # a worker could not start: the replica stops

    def run(self) -> None:
        """Run until SIGTERM or SIGINT and every worker has stopped."""
        (self.directory / METRICS_DIR).mkdir(exist_ok=True)
        # prometheus-client's multiprocess files: its own setting, read in each worker
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.directory / METRICS_DIR)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self.count):
            self._spawn(slot)
        logger.info("%d workers on %s", self.count, self.sock.getsockname())
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            self._reap(pid, status)

    def _reap(self, pid: int, status: int) -> None:
        slot, started = self.children.pop(pid)
        mark_process_dead(pid, str(self.directory / METRICS_DIR))  # type: ignore[no-untyped-call]
        if self.stopping:
            return
        if os.waitstatus_to_exitcode(status) == STARTUP_FAILURE:  # as one process would, exit
            logger.error("worker %d (pid %d) could not start; stopping the replica", slot, pid)
            self.failed = True
            self._stop(signal.SIGTERM, None)
            return
        logger.warning("worker %d (pid %d) ended (%s); starting it again", slot, pid, status)
        if time.monotonic() - started < RESTART_BACKOFF_S:
            time.sleep(RESTART_BACKOFF_S)
        if not self.stopping:
            self._spawn(slot)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            logger.info("stopping %d workers", len(self.children))
        self.stopping = True
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _spawn(self, slot: int) -> None:
        parent = os.getpid()
        gc.freeze()  # the collector never writes to what the worker inherits: it stays shared
        pid = os.fork()
        if pid == 0:
            _run_worker(parent, self.sock, Replica(self.directory, slot), self.serve)
        self.children[pid] = (slot, time.monotonic())


def _run_worker(parent: int, sock: socket.socket, replica: Replica, serve: ServeWorker) -> None:
    """The forked worker: serve, then leave without running the supervisor's exit code."""
    code = 1
    try:
        os.setpgid(0, 0)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)  # uvicorn installs its own
        _die_with(parent)
        # counts in the shared files
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        # Gauges the leader removes are served from its memory, never from the files
        # (gateway/metrics.py), so removing one is right here.
        warnings.filterwarnings("ignore", "(Removal of|Clearing) labels", UserWarning)
        serve(sock, replica)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        logger.exception("worker %d failed", replica.slot)
    finally:
        logging.shutdown()
        os._exit(code)


def _die_with(parent: int) -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux); leave if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(0)


def run_workers(
    count: int, host: str, port: int, state_dir: Path | None, serve: ServeWorker
) -> None:
    """Serve with `count` workers on (host, port) until stopped; see the module's docstring."""
    sock = listen(host, port)
    directory, temporary = prepare_state_dir(state_dir)
    supervisor = Supervisor(count, sock, directory, serve)
    try:
        supervisor.run()
    finally:
        sock.close()
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
    if supervisor.failed:
        raise SystemExit(STARTUP_FAILURE)
