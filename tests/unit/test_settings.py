"""Settings: every field documented, weak admin tokens refused, URLs normalised."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import Settings


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_field_is_documented(name: str) -> None:
    description = Settings.model_fields[name].description
    assert description is not None, name
    assert len(description) > 30, name
    assert "default" in description.lower(), name


def test_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGATE_ADMIN_TOKEN", "a-long-enough-random-token-xyz")
    monkeypatch.setenv("DRAFTGATE_PORT", "9090")
    settings = Settings()
    assert settings.port == 9090
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "a-long-enough-random-token-xyz"
    assert "a-long-enough" not in repr(settings)


def test_defaults_are_local_and_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DRAFTGATE_{name.upper()}", raising=False)
    settings = Settings()
    assert settings.database_url.startswith("sqlite:///")
    assert settings.host == "127.0.0.1"
    assert settings.admin_token is None
    assert settings.dev_mode is False


@pytest.mark.parametrize("token", ["", "changeme", "ADMIN", " secret ", "short-token"])
def test_weak_admin_tokens_are_refused(token: str) -> None:
    with pytest.raises(ValidationError, match="DRAFTGATE_ADMIN_TOKEN"):
        Settings(admin_token=token)


@pytest.mark.parametrize("token", ["", "changeme", "short-token"])
def test_weak_read_tokens_are_refused(token: str) -> None:
    with pytest.raises(ValidationError, match="DRAFTGATE_ADMIN_READ_TOKEN"):
        Settings(admin_token="a-long-enough-random-token-xyz", admin_read_token=token)


def test_the_read_token_cannot_be_the_admin_token() -> None:
    token = "a-long-enough-random-token-xyz"
    with pytest.raises(ValidationError, match="must differ"):
        Settings(admin_token=token, admin_read_token=token)


def test_dev_mode_allows_a_weak_token() -> None:
    settings = Settings(admin_token="changeme", dev_mode=True)
    assert settings.admin_token is not None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_postgres_urls_use_psycopg(url: str, expected: str) -> None:
    assert Settings(database_url=url).database_url == expected


def test_forwarded_headers_are_an_allow_list_without_hop_or_credential_headers() -> None:
    token = "a-long-enough-admin-token"
    settings = Settings(admin_token=token, forward_headers=" TraceParent, tracestate,x-team ")
    assert settings.forwarded_headers == (b"traceparent", b"tracestate", b"x-team")
    assert Settings(admin_token=token, forward_headers="").forwarded_headers == ()
    for refused in ("authorization", "traceparent,Connection", "host", "bad header"):
        with pytest.raises(ValidationError):
            Settings(admin_token=token, forward_headers=refused)


def test_relayed_paths_are_exact_v1_paths() -> None:
    token = "a-long-enough-admin-token"
    settings = Settings(admin_token=token, relayed_paths="/v1/chat/completions, /v1/pooling")
    assert settings.relayed == {"/v1/chat/completions", "/v1/pooling"}
    assert "/v1/load_lora_adapter" not in Settings(admin_token=token).relayed
    for refused in ("/metrics", "/v1/../sleep", "/v1//x", "/v1/a%2fb", "v1/chat"):
        with pytest.raises(ValidationError):
            Settings(admin_token=token, relayed_paths=refused)


def test_a_refusal_never_repeats_the_value_it_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(admin_token="short-secret-x")
    assert "short-secret-x" not in str(refused.value)
