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
    admin_read_token: SecretStr | None = Field(
        default=None,
        description="The gateway's read token (`DRAFTGATE_ADMIN_READ_TOKEN`): what the "
        "dashboard reads with unless `dashboard_admin` is on; it then offers no changes. No "
        "default: without it every page says how to set it. Never shown on a page.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="The gateway's admin token, used only when `dashboard_admin` is on. No "
        "default. Never shown on a page.",
    )
    dashboard_admin: bool = Field(
        default=False,
        description="Act with the admin token: the pages offer changes (policies, backends, "
        "keys, sweeps). Default off: the dashboard has no login of its own, so put one in "
        "front of it first (docs/deploy.md). `draftgate up` turns it on for its loopback "
        "demo; `draftgate dashboard --admin` does too.",
    )
    admin_user_header: str = Field(
        default="",
        description="The header a login proxy in front of the dashboard sets to the signed-in "
        "person (`x-forwarded-user`, `x-auth-request-user`): the dashboard forwards it with "
        "each change it makes, so the gateway's audit log names that person (the gateway "
        "reads the same setting and must list the dashboard's address in "
        "`DRAFTGATE_ADMIN_TRUSTED_PROXIES`; docs/identity.md). Default empty: off.",
    )
    dashboard_allowed_hosts: str = Field(
        default="localhost,127.0.0.1,::1",
        description="Comma-separated host names the dashboard answers to (the `Host` of a "
        "request, the `Origin` of its WebSocket; `*.example.com` for subdomains, `*` for "
        "any): anything else is a 403, which stops DNS rebinding. Default: loopback names "
        "only; add the name a login proxy or browser uses to reach it.",
    )
    dashboard_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a client has to send a whole request to the dashboard's server "
        "(a trickled head is cut with a 408). Default 10 s.",
    )
    dashboard_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds to wait for one admin API answer. Default 10 s: a plan "
        "fits measurements and can take a moment on a busy machine.",
    )

    @property
    def allowed_hosts(self) -> list[str]:
        """`dashboard_allowed_hosts` as a list."""
        return [h.strip().lower() for h in self.dashboard_allowed_hosts.split(",") if h.strip()]
