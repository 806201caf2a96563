"""The resolver against a real DNS server (dnsmasq on loopback) whose records change."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.control.dns import (
    AAAA,
    A,
    DnsError,
    Resolution,
    Resolver,
    _over_udp,
    _truncated,
    answers,
    query,
)
from tests.dns_server import DnsServer


@pytest.fixture
def dns(tmp_path: Path) -> Iterator[DnsServer]:
    server = DnsServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_a_name_resolves_to_its_a_and_aaaa_records_as_they_change(dns: DnsServer) -> None:
    resolver = Resolver.parse(dns.address)
    dns.set("pool.test", ["127.0.0.2", "127.0.0.3", "fd00::7"])
    assert asyncio.run(resolver.addresses("pool.test")) == {"127.0.0.2", "127.0.0.3", "fd00::7"}
    dns.set("pool.test", ["127.0.0.3"])
    assert asyncio.run(resolver.addresses("pool.test")) == {"127.0.0.3"}
    assert asyncio.run(resolver.addresses("nothing-here.test")) == frozenset()  # NXDOMAIN


def test_a_server_that_does_not_answer_is_an_error_not_an_empty_pool(dns: DnsServer) -> None:
    resolver = Resolver.parse(dns.address, timeout_s=0.3)
    dns.set("pool.test", ["127.0.0.2"])
    dns.stop()
    with pytest.raises(DnsError, match=r"cannot resolve pool\.test"):
        asyncio.run(resolver.addresses("pool.test"))


def test_a_short_name_resolves_as_a_services_does(dns: DnsServer) -> None:
    dns.set("vllm-qwen3-8b-plain", ["127.0.0.20"])
    resolution = asyncio.run(Resolver.parse(dns.address).resolve("vllm-qwen3-8b-plain"))
    assert resolution == Resolution(frozenset({"127.0.0.20"}))  # AAAA: no data, no error


def test_one_record_type_refused_is_a_partial_answer(tmp_path: Path) -> None:
    """Without `--domain-needed`, dnsmasq refuses an AAAA query for a bare name it holds
    only an A record of: the addresses found are kept, and the answer says it is partial
    (discovery then adds members but removes none)."""
    dns = DnsServer(tmp_path, options=("--local=/test/", "--local=//"))
    try:
        dns.set("vllm-qwen3-8b-plain", ["127.0.0.20"])
        resolver = Resolver.parse(dns.address)
        resolution = asyncio.run(resolver.resolve("vllm-qwen3-8b-plain"))
        assert resolution.addresses == {"127.0.0.20"}
        [error] = resolution.errors
        assert "(AAAA)" in error
        with pytest.raises(DnsError, match="error code 5"):  # both refused: an error
            asyncio.run(resolver.resolve("unknown"))
    finally:
        dns.stop()


def test_a_pool_too_big_for_a_datagram_is_read_over_tcp(dns: DnsServer) -> None:
    """512 bytes hold about 28 IPv4 addresses: the server answers truncated over UDP, and
    the whole answer comes over TCP."""
    addresses = {f"10.1.{i // 250}.{i % 250}" for i in range(300)}
    dns.set("big.test", addresses)
    udp = _over_udp(("127.0.0.1", dns.port), query("big.test", A, 5), 5, 2.0)
    assert _truncated(udp)  # what a resolver without TCP would have to make do with
    assert asyncio.run(Resolver.parse(dns.address).addresses("big.test")) == addresses


def test_server_addresses_parse() -> None:
    assert Resolver.parse("10.0.0.10:5353").server == ("10.0.0.10", 5353)
    assert Resolver.parse("10.0.0.10").server == ("10.0.0.10", 53)
    assert Resolver.parse("[fd00::10]:5353").server == ("fd00::10", 5353)
    assert Resolver.parse(None).server is None


def test_malformed_and_truncated_replies_are_errors() -> None:
    ident = 7
    packet = query("pool.test", AAAA, ident)
    truncated = struct.pack("!HH", ident, 0x8200) + packet[4:]
    with pytest.raises(DnsError, match="truncated"):
        answers(truncated, AAAA)
    with pytest.raises(DnsError, match="malformed"):
        answers(struct.pack("!HHHHHH", ident, 0x8000, 0, 1, 0, 0) + b"\x05ab", AAAA)
    with pytest.raises(DnsError, match="not a DNS name"):
        query("bad..name", AAAA, ident)
