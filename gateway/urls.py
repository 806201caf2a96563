"""Backend URLs: what the gateway accepts as a backend's address, and URLs made safe to print.

A backend URL is a base URL the relay appends `/v1/...` to, so it may carry a scheme
(http or https), a host, a port and a path prefix, and nothing else: credentials in it would
be shown by the API, the audit log and the dashboard (a backend's key is a field of its own,
never shown), and a query or a fragment would cut or move every relayed path. Link-local
and cloud metadata addresses (IPv4 ones inside IPv6 forms too: mapped, NAT64, 6to4, Teredo)
are refused unless allowed (DRAFTGATE_ALLOW_LINK_LOCAL_BACKENDS): a backend URL is an address
the gateway sends requests to, and those are where a cloud machine keeps its credentials. An
unspecified address (0.0.0.0, ::) is refused always: it is where a server listens, and
connecting to it reaches this machine. Only literal addresses and the well-known metadata names are
checked; a name that resolves to such an address is the resolver's to refuse.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from pydantic import AnyUrl

# Names cloud providers serve instance metadata under (GCP's, AWS's, Tencent Cloud's).
METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal", "metadata.tencentyun.com",
})  # fmt: skip
# IPv6 prefixes that carry an IPv4 address in their last 32 bits: NAT64's well-known and
# local-use ones (a NAT64 gateway forwards them to that IPv4 address), and the deprecated
# IPv4-compatible form.
IPV4_IN_LAST_32 = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("::/96"),
)
# Metadata addresses outside the link-local ranges: AWS's IPv6 one, Alibaba Cloud's.
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)


def check_backend_url(url: AnyUrl) -> str:
    """The base URL as stored (no trailing slash), or a ValueError saying what is wrong."""
    if url.scheme not in ("http", "https"):
        raise ValueError(f"url must be http or https, got {url.scheme!r}")
    if url.username is not None or url.password is not None:
        raise ValueError("url must not carry credentials; give the backend an api_key instead")
    if url.query is not None or url.fragment is not None:
        raise ValueError("url must not have a query or a fragment: /v1/... is appended to it")
    if (address := _literal_address((url.host or "").strip("[]"))) and address.is_unspecified:
        raise ValueError(
            f"url host {url.host} is where a server listens, not an address to send to: give "
            "127.0.0.1 or the server's own address"
        )
    text = str(url).rstrip("/")
    if text.endswith("/v1"):
        raise ValueError(f"url is the server's base URL without /v1, got {text!r}")
    return text


def is_link_local(host: str) -> bool:
    """Whether `host` is a link-local or cloud metadata address (in any literal form)."""
    name = host.strip("[]").lower().rstrip(".")
    if name in METADATA_HOSTS:
        return True
    address = _literal_address(name)
    if address is None:
        return False
    return any(a.is_link_local or a in METADATA_ADDRESSES for a in _and_embedded(address))


def _and_embedded(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The address and any IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, Teredo,
    IPv4-compatible): each reaches that IPv4 host through some router or stack."""
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            found.append(address.sixtofour)
        if address.teredo is not None:
            found.append(address.teredo[1])
        if any(address in network for network in IPV4_IN_LAST_32):
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def _literal_address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        pass
    try:  # the forms a resolver also reads as IPv4: 2852039166, 0xa9.0xfe.0xa9.0xfe, ...
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError:
        return None


def masked(url: str) -> str:
    """`url` with any password replaced by `***`, for printing: in its userinfo, and in a
    query parameter libpq reads one from (`?password=`, `?sslpassword=`)."""
    url = re.sub(r"(?i)([?&](?:ssl)?password=)[^&#]*", r"\1***", url)
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"
