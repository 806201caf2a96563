"""The dashboard's settings: environment variables prefixed `DRAFTGATE_`."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    """Where the admin API is and how to call it; read once per page run."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGATE_", extra="ignore")

    dashboard_gateway_url: str = Field(
        default="http://127.0.0.1:8080",
        description="Base URL of the gateway whose admin API the dashboard reads and writes. "
        "Default: the gateway of `draftgate up` on this machine.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the admin API (the gateway's own). No default: without "
        "it every page says how to set it. Never shown on a page.",
    )
    dashboard_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds to wait for one admin API answer. Default 10 s: a plan "
        "fits measurements and can take a moment on a busy machine.",
    )
