"""Backend URLs: which hosts are link-local or metadata, and URLs made safe to print."""

from __future__ import annotations

import pytest

from gateway.urls import is_link_local, masked


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("169.254.169.254", True),
        ("2852039166", True),  # the same address as one number
        ("0xa9.0xfe.0xa9.0xfe", True),
        ("[fe80::1]", True),
        ("[::ffff:a9fe:a9fe]", True),  # IPv4-mapped
        ("[fd00:ec2::254]", True),  # AWS's IPv6 metadata address
        ("100.100.100.200", True),  # Alibaba Cloud's
        ("metadata.google.internal.", True),
        ("metadata.goog", True),
        ("instance-data.ec2.internal", True),
        ("[64:ff9b::a9fe:a9fe]", True),  # NAT64: forwarded to 169.254.169.254
        ("[64:ff9b:1::a9fe:a9fe]", True),  # NAT64, local-use prefix
        ("[2002:a9fe:a9fe::1]", True),  # 6to4 of 169.254.169.254
        ("[2001:0:4136:e378:8000:63bf:5601:5601]", True),  # Teredo, client 169.254.169.254
        ("[::a9fe:a9fe]", True),  # IPv4-compatible
        ("[64:ff9b::a00:7]", False),  # NAT64 of 10.0.0.7
        ("[2002:a00:7::1]", False),  # 6to4 of 10.0.0.7
        ("127.0.0.1", False),
        ("10.0.0.7", False),
        ("[::1]", False),
        ("vllm-plain", False),
    ],
)
def test_link_local_and_metadata_hosts(host: str, refused: bool) -> None:
    assert is_link_local(host) is refused


def test_printed_urls_hide_their_password() -> None:
    url = "postgresql+psycopg://draftgate:hunter2@db:5432/draftgate"
    assert masked(url) == "postgresql+psycopg://draftgate:***@db:5432/draftgate"
    assert masked("sqlite:///.draftgate/draftgate.db") == "sqlite:///.draftgate/draftgate.db"
    assert masked("http://user@host/") == "http://user@host/"
    in_query = "postgresql://db:5432/draftgate?sslmode=require&password=hunter2&connect_timeout=5"
    assert masked(in_query) == (
        "postgresql://db:5432/draftgate?sslmode=require&password=***&connect_timeout=5"
    )
    assert masked("postgresql://u:a@db/x?PASSWORD=b&sslpassword=c") == (
        "postgresql://u:***@db/x?PASSWORD=***&sslpassword=***"
    )
