"""The addresses a DNS name holds: A and AAAA records, from the system's resolver or a
nameserver of our own choosing (RFC 1035 over UDP; what a headless Service answers).

The system resolver (getaddrinfo) follows `/etc/resolv.conf`, as proxies in a cluster do: a
pod's short Service names resolve through its search domains. A nameserver given as
`host:port` is asked directly, so a test can run its own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import struct
from dataclasses import dataclass

A, AAAA = 1, 28
_HEADER = struct.Struct("!HHHHHH")
_RECORD = struct.Struct("!HHIH")
_RECURSION_DESIRED = 0x0100
_TRUNCATED = 0x0200
_NXDOMAIN = 3


class DnsError(Exception):
    """A name that could not be resolved: no answer, a server error, a malformed reply."""


@dataclass(frozen=True)
class Resolution:
    """The addresses found, and the record types that could not be asked (partial)."""

    addresses: frozenset[str]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolver:
    """Resolves names to the set of their addresses; `server` is (host, port) or None."""

    server: tuple[str, int] | None = None
    timeout_s: float = 2.0

    @classmethod
    def parse(cls, server: str | None, timeout_s: float = 2.0) -> Resolver:
        """`host:port` (or `[v6]:port`, or a bare host on port 53), or None for the system's."""
        if not server:
            return cls(None, timeout_s)
        if server.startswith("["):
            host, _, port = server[1:].partition("]")
            port = port.removeprefix(":")
        elif server.count(":") == 1:
            host, _, port = server.partition(":")
        else:
            host, port = server, ""
        return cls((host, int(port or 53)), timeout_s)

    async def addresses(self, name: str) -> frozenset[str]:
        """Every A and AAAA address of `name` (empty when the name does not exist)."""
        return (await self.resolve(name)).addresses

    async def resolve(self, name: str) -> Resolution:
        """`name`'s A and AAAA addresses. One record type failing while the other answers
        (some servers refuse AAAA queries for names they hold only A records of) gives a
        partial resolution; both failing, or one failing and the other empty, an error."""
        if self.server is None:
            return Resolution(await self._system(name))
        found: set[str] = set()
        errors = []
        for qtype in (A, AAAA):
            try:
                found |= await asyncio.to_thread(self._ask, name, qtype)
            except DnsError as exc:
                errors.append(str(exc))
        if errors and not found:
            raise DnsError(errors[0])
        return Resolution(frozenset(found), tuple(errors))

    async def _system(self, name: str) -> frozenset[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), self.timeout_s
            )
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5)):
                return frozenset()
            raise DnsError(f"cannot resolve {name}: {exc.strerror}") from exc
        except TimeoutError:
            raise DnsError(f"cannot resolve {name}: no answer in {self.timeout_s} s") from None
        return frozenset(str(info[4][0]) for info in infos)

    def _ask(self, name: str, qtype: int) -> set[str]:
        """One record type of `name`, over UDP; over TCP when the answer did not fit in a
        datagram (a query without EDNS gets 512 bytes: about 28 IPv4 addresses), as RFC 7766
        has resolvers do."""
        assert self.server is not None
        ident = random.getrandbits(16)
        packet = query(name, qtype, ident)
        try:
            reply = _over_udp(self.server, packet, ident, self.timeout_s)
            if _truncated(reply):
                reply = _over_tcp(self.server, packet, ident, self.timeout_s)
        except OSError as exc:  # refused, unreachable or timed out
            raise DnsError(f"cannot resolve {name} at {self.server}: {exc}") from exc
        try:
            return answers(reply, qtype)
        except DnsError as exc:
            kind = "A" if qtype == A else "AAAA"
            raise DnsError(f"cannot resolve {name} ({kind}) at {self.server}: {exc}") from exc


def _over_udp(server: tuple[str, int], packet: bytes, ident: int, timeout_s: float) -> bytes:
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(server)
        sock.send(packet)
        while True:  # a stray datagram with another id is not our answer
            reply = sock.recv(4096)
            if len(reply) >= 2 and struct.unpack_from("!H", reply)[0] == ident:
                return reply


def _over_tcp(server: tuple[str, int], packet: bytes, ident: int, timeout_s: float) -> bytes:
    with socket.create_connection(server, timeout=timeout_s) as sock:
        sock.sendall(struct.pack("!H", len(packet)) + packet)
        (length,) = struct.unpack("!H", _read_exactly(sock, 2))
        reply = _read_exactly(sock, length)
    if len(reply) < 2 or struct.unpack_from("!H", reply)[0] != ident:
        raise DnsError("the TCP answer is not to our query")
    return reply


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise DnsError("the server closed the connection mid-answer")
        data += chunk
    return data


def _truncated(reply: bytes) -> bool:
    return len(reply) >= 4 and bool(struct.unpack_from("!H", reply, 2)[0] & _TRUNCATED)


def query(name: str, qtype: int, ident: int) -> bytes:
    """A recursive query for one record type of `name`."""
    labels = [label.encode("idna") for label in name.rstrip(".").split(".")]
    if any(not 0 < len(label) < 64 for label in labels):
        raise DnsError(f"not a DNS name: {name!r}")
    qname = b"".join(bytes([len(label)]) + label for label in labels) + b"\0"
    return (
        _HEADER.pack(ident, _RECURSION_DESIRED, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, 1)
    )


def answers(reply: bytes, qtype: int) -> set[str]:
    """The addresses of type `qtype` in a reply (none for a name that does not exist)."""
    try:
        _, flags, questions, count, _, _ = _HEADER.unpack_from(reply)
        if flags & _TRUNCATED:
            raise DnsError("the answer was truncated (more addresses than a datagram holds)")
        if flags & 0xF == _NXDOMAIN:
            return set()
        if flags & 0xF:
            raise DnsError(f"the server answered with error code {flags & 0xF}")
        offset = _HEADER.size
        for _ in range(questions):
            offset = _skip_name(reply, offset) + 4
        found = set()
        for _ in range(count):
            offset = _skip_name(reply, offset)
            rtype, _, _, length = _RECORD.unpack_from(reply, offset)
            offset += _RECORD.size
            data = reply[offset : offset + length]
            offset += length
            if rtype == qtype and len(data) == (4 if qtype == A else 16):
                found.add(str(ipaddress.ip_address(data)))
        return found
    except (struct.error, IndexError) as exc:
        raise DnsError(f"malformed DNS reply: {exc}") from exc


def _skip_name(packet: bytes, offset: int) -> int:
    """The offset past a (possibly compressed) name."""
    while True:
        length = packet[offset]
        if length & 0xC0 == 0xC0:
            return offset + 2
        if length == 0:
            return offset + 1
        offset += 1 + length
