"""The gateway's settings: environment variables prefixed `DRAFTGATE_`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Tokens that people paste from examples; refused unless `dev_mode` is on.
PLACEHOLDER_TOKENS = frozenset(
    {"", "admin", "changeme", "change-me", "password", "secret", "token", "test", "draftgate"}
)
MIN_ADMIN_TOKEN_CHARS = 16


class Settings(BaseSettings):
    """Settings of one gateway process; read once and passed to `create_app`."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGATE_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///.draftgate/draftgate.db",
        description=(
            "SQLAlchemy URL of the database. Default: a SQLite file under `.draftgate/` in the "
            "working directory, so the local demo needs no server. `postgresql://` URLs use "
            "the psycopg 3 driver."
        ),
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token for `/admin/v1`. No default: `draftgate up` generates one when unset, "
            "`draftgate gateway` refuses to start without one. Placeholders and tokens shorter "
            f"than {MIN_ADMIN_TOKEN_CHARS} characters are refused unless `dev_mode` is on."
        ),
    )
    dev_mode: bool = Field(
        default=False,
        description=(
            "Explicit developer flag that allows a weak admin token. Default off, so a "
            "production deployment cannot start with `changeme`."
        ),
    )
    fleet: Path | None = Field(
        default=None,
        description=(
            "Path to a `fleet.yaml` declaring backends, models with policies, and GPU prices, "
            "applied idempotently at start. Default: none (configure through the admin API)."
        ),
    )
    host: str = Field(
        default="127.0.0.1",
        description="Interface the gateway listens on. Default loopback: nothing is exposed "
        "beyond this machine unless configured.",
    )
    port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        description="TCP port of the gateway. Default 8080, the port docs and compose use.",
    )
    migrate_on_start: bool = Field(
        default=True,
        description=(
            "Apply pending database migrations when the gateway starts. Default on so a fresh "
            "database works at once; turn off when migrations run as a separate deploy step."
        ),
    )
    log_level: str = Field(
        default="info",
        description="Python logging level name for draftgate's loggers. Default `info`.",
    )

    @field_validator("database_url")
    @classmethod
    def _use_psycopg(cls, url: str) -> str:
        """Point bare `postgresql://` URLs at psycopg 3, the driver we install."""
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url.removeprefix(prefix)
        return url

    @model_validator(mode="after")
    def _refuse_weak_admin_token(self) -> Settings:
        """Refuse a placeholder or short admin token outside dev mode."""
        if self.admin_token is None or self.dev_mode:
            return self
        token = self.admin_token.get_secret_value()
        if token.strip().lower() in PLACEHOLDER_TOKENS or len(token) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                "DRAFTGATE_ADMIN_TOKEN is empty, a placeholder or shorter than "
                f"{MIN_ADMIN_TOKEN_CHARS} characters; set a random token "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`) "
                "or DRAFTGATE_DEV_MODE=true for local development"
            )
        return self
