"""A real DNS server on loopback for the discovery tests: Debian's dnsmasq (`make test`
installs `dnsmasq-base`), answering for `*.test` from a hosts file the test rewrites."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from gateway.control.dns import DnsError, Resolver
from tests.e2e.conftest import free_port

DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
WAIT_S = 20.0  # a deadline, not a wait
AUTHORITATIVE = ("--local=/test/", "--domain-needed", "--local=//")


def _free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (dnsmasq listens on both)."""
    for _ in range(50):
        port = free_port()  # TCP, and never handed out before in this session
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free for both TCP and UDP")


class DnsServer:
    """dnsmasq on 127.0.0.1:`port`, answering from its hosts file for `.test` and for bare
    names (a Service's short name) as a cluster's DNS does: unknown names NXDOMAIN, a type
    a name has no record of NODATA. `options` replace the last three flags."""

    def __init__(self, directory: Path, options: Sequence[str] = AUTHORITATIVE) -> None:
        self.options = tuple(options)
        if not os.access(DNSMASQ, os.X_OK):
            pytest.fail(f"{DNSMASQ} is missing: `make test` installs Debian's dnsmasq-base")
        self.hosts = directory / "hosts"
        self.hosts.write_text("")
        self.port = _free_port()
        self.log = directory / f"dnsmasq-{self.port}.log"
        self.records: dict[str, frozenset[str]] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def address(self) -> str:
        """`host:port`, as DRAFTGATE_DNS_SERVER takes it."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Run the server and wait until it answers."""
        argv = [
            DNSMASQ, "--keep-in-foreground", f"--port={self.port}",
            "--listen-address=127.0.0.1", "--bind-interfaces", "--no-resolv", "--no-hosts",
            f"--addn-hosts={self.hosts}", "--conf-file=/dev/null", "--pid-file=",
            f"--user={_user()}", "--cache-size=0", *self.options,
        ]  # fmt: skip
        with self.log.open("ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        self._wait_for(self.records)

    def stop(self) -> None:
        """Stop the server (an outage: queries go unanswered)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """Make `name` hold exactly `addresses` (none: the name is gone), and wait until the
        server answers so."""
        self.records[name] = frozenset(addresses)
        lines = [f"{a} {n}" for n, found in sorted(self.records.items()) for a in sorted(found)]
        self.hosts.write_text("\n".join(lines) + "\n")
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)  # dnsmasq re-reads its hosts files
        self._wait_for({name: self.records[name]})

    def _wait_for(self, expected: Mapping[str, frozenset[str]]) -> None:
        resolver = Resolver(("127.0.0.1", self.port), timeout_s=0.5)
        deadline = time.monotonic() + WAIT_S
        names = list(expected) or ["started.test"]  # any answer at all, at the start
        seen: object = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                pytest.fail(f"dnsmasq exited: {self.log.read_text(errors='replace')}")
            try:
                seen = {n: asyncio.run(resolver.addresses(n)) for n in names}
                if not expected or seen == dict(expected):
                    return
            except DnsError as exc:
                seen = exc
            time.sleep(0.05)
        pytest.fail(f"dnsmasq never answered {dict(expected)}: {seen!r}")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
