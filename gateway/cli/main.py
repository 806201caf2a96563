"""The `draftgate` command: the stack, the gateway alone, the database and API keys."""

from __future__ import annotations

import signal
from typing import Annotated

import typer
import uvicorn

from gateway.cli.common import CLI_ACTOR, fail, session, settings_from_env
from gateway.cli.dev import dev_app
from gateway.cli.measure import bench, import_app
from gateway.cli.plan import plan_app
from gateway.cli.serve import Port, exit_zero, serve
from gateway.cli.sim import sim_app
from gateway.cli.up import up

app = typer.Typer(help="draftgate: a cost-aware gateway for speculative-decoding vLLM fleets.")
db_app = typer.Typer(help="Database schema.")
keys_app = typer.Typer(help="Client API keys.")
teams_app = typer.Typer(help="Teams: groups of keys that spend as one.")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(teams_app, name="teams")
app.add_typer(plan_app, name="plan")
app.add_typer(import_app, name="import")
app.add_typer(dev_app, name="dev")
app.command()(bench)

# The dashboard's server: request heads as the gateway's defaults bound them (a browser
# sends a few KiB), and a client that reads nothing of an answer for 30 s is cut.
DASHBOARD_MAX_HEADER_BYTES = 65536
DASHBOARD_MAX_HEADERS = 100
DASHBOARD_WRITE_TIMEOUT_S = 30.0


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Interface to listen on.")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535)] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Worker processes on the port (DRAFTGATE_WORKERS)."),
    ] = None,
) -> None:
    """Run the gateway alone (settings from DRAFTGATE_* and DRAFTGATE_FLEET)."""
    given = {"host": host, "port": port, "workers": workers}
    overrides = {k: v for k, v in given.items() if v is not None}
    settings = settings_from_env(**overrides)
    if settings.admin_token is None:
        fail("DRAFTGATE_ADMIN_TOKEN is not set; the admin API needs a token")
    serve(settings)


app.command()(up)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration to DRAFTGATE_DATABASE_URL."""
    from gateway.db import migrate
    from gateway.db.session import make_engine

    engine = make_engine(settings_from_env().database_url)
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        after = migrate.current_revision(engine)
    finally:
        engine.dispose()
    status = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    typer.echo(f"database {status} revision {after}")


@keys_app.command("create")
def keys_create(
    name: str,
    requests_per_minute: Annotated[int | None, typer.Option(min=1)] = None,
    tokens_per_minute: Annotated[int | None, typer.Option(min=1)] = None,
    max_concurrent_requests: Annotated[
        int | None, typer.Option(min=1, help="Requests in flight at once, per replica.")
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(min=1024, help="Largest request body it may send, in bytes.")
    ] = None,
    budget_usd: Annotated[float | None, typer.Option(min=0)] = None,
    lossless_opt_out: Annotated[
        bool,
        typer.Option(
            "--lossless-opt-out", help="Its requests are never replayed by the lossless watchdog."
        ),
    ] = False,
    team_id: Annotated[int | None, typer.Option(help="The team it belongs to.")] = None,
) -> None:
    """Create an API key and print it once."""
    from gateway.schemas.resources import KeyCreate
    from gateway.services.keys import create_key

    data = KeyCreate(
        name=name,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        max_concurrent_requests=max_concurrent_requests,
        max_body_bytes=max_body_bytes,
        budget_usd=budget_usd,
        lossless_opt_out=lossless_opt_out,
        team_id=team_id,
    )
    with session() as db:
        created = create_key(db, data, CLI_ACTOR)
    typer.echo(f"created key {created.id} ({created.name}); it is shown only this once:")
    typer.echo(created.key)


@teams_app.command("create")
def teams_create(
    name: str,
    budget_usd: Annotated[
        float | None, typer.Option(min=0, help="Its keys' spend together, per month.")
    ] = None,
    weight: Annotated[
        float, typer.Option(min=0.01, max=1000, help="Its share of a full model's backends.")
    ] = 1.0,
    priority: Annotated[
        int, typer.Option(min=-100, max=100, help="Its requests' priority, lower first.")
    ] = 0,
) -> None:
    """Create a team (give it keys with `keys create --team-id`)."""
    from gateway.schemas.teams import TeamCreate
    from gateway.services.teams import create_team

    data = TeamCreate(name=name, budget_usd=budget_usd, weight=weight, priority=priority)
    with session() as db:
        team = create_team(db, data, CLI_ACTOR)
    typer.echo(f"created team {team.id} ({team.name})")


@teams_app.command("list")
def teams_list() -> None:
    """List teams with their active keys."""
    from gateway.services.teams import list_teams

    with session() as db:
        teams = list_teams(db)
    typer.echo(f"{'id':>5}  {'name':<24} {'keys':>5}  {'weight':>6}  {'priority':>8}  budget")
    for team in teams:
        budget = "-" if team.budget_usd is None else f"${team.budget_usd:,.2f} {team.budget_period}"
        shares = f"{team.weight:>6g}  {team.priority:>8}"
        typer.echo(f"{team.id:>5}  {team.name:<24} {team.keys:>5}  {shares}  {budget}")


@keys_app.command("list")
def keys_list(include_revoked: bool = False) -> None:
    """List API keys (prefixes only; secrets are never stored)."""
    from gateway.db import queries

    with session() as db:
        rows = queries.list_keys(db, include_revoked)
        typer.echo(f"{'id':>5}  {'prefix':<12} {'name':<24} {'team':>5}  {'created':<20} revoked")
        for row in rows:
            created = row.created_at.strftime("%Y-%m-%d %H:%M:%S")
            revoked = row.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if row.revoked_at else "-"
            team = "-" if row.team_id is None else str(row.team_id)
            named = f"{row.id:>5}  {row.key_prefix:<12} {row.name:<24}"
            typer.echo(f"{named} {team:>5}  {created:<20} {revoked}")


@keys_app.command("revoke")
def keys_revoke(key_id: int) -> None:
    """Revoke an API key by id."""
    from gateway.errors import NotFound
    from gateway.services.keys import revoke_key

    try:
        with session() as db:
            row = revoke_key(db, key_id, CLI_ACTOR)
    except NotFound as exc:
        fail(exc.message, 1)
    typer.echo(f"revoked key {row.id} ({row.key_prefix}…, {row.name})")


app.add_typer(sim_app, name="sim")


@app.command("dashboard")
def dashboard_command(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Port = 8501,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="Act with DRAFTGATE_ADMIN_TOKEN, so the pages offer changes "
            "(DRAFTGATE_DASHBOARD_ADMIN). Put a login in front of it first.",
        ),
    ] = False,
) -> None:
    """Run the dashboard against DRAFTGATE_DASHBOARD_GATEWAY_URL, reading with
    DRAFTGATE_ADMIN_READ_TOKEN (or acting with DRAFTGATE_ADMIN_TOKEN under --admin)."""
    import os

    from dashboard.server import dashboard_app
    from dashboard.settings import DashboardSettings
    from gateway.server.http_limits import RequestLimits, protocol_with

    if admin:
        os.environ["DRAFTGATE_DASHBOARD_ADMIN"] = "true"  # the pages read their settings per run
    settings = DashboardSettings()
    limits = RequestLimits(
        DASHBOARD_MAX_HEADER_BYTES,
        DASHBOARD_MAX_HEADERS,
        settings.dashboard_read_timeout_s,
        DASHBOARD_WRITE_TIMEOUT_S,
    )
    signal.signal(signal.SIGTERM, exit_zero)
    uvicorn.run(
        dashboard_app(settings.allowed_hosts),
        host=host,
        port=port,
        http=protocol_with(limits),
        ws="websockets-sansio",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
