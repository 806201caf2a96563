"""Backend URLs: what the gateway accepts as a backend's address, and URLs made safe to print.

A backend URL is a base URL the relay appends `/v1/...` to, so it may carry a scheme
(http or https), a host, a port and a path prefix, and nothing else: credentials in it would
be shown by the API, the audit log and the dashboard (a backend's key is a field of its own,
never shown), and a query or a fragment would cut or move every relayed path. Link-local
and cloud metadata addresses are refused unless allowed (DRAFTGATE_ALLOW_LINK_LOCAL_BACKENDS):
a backend URL is an address the gateway sends requests to, and those are where a cloud
machine keeps its credentials. Only literal addresses and the well-known metadata names are
checked; a name that resolves to such an address is the resolver's to refuse.
"""

from __future__ import annotations

import ipaddress
import socket

from pydantic import AnyUrl

# Names cloud providers serve instance metadata under (GCP, Azure's and AWS's aliases).
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "instance-data"})
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
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_link_local or address in METADATA_ADDRESSES


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
    """`url` with any password replaced by `***`, for printing."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"
