"""Teams and keys: per-key usage and spend against budget, each team's spend and the top end
users; create teams, create and revoke keys."""

from __future__ import annotations

import streamlit as st

from dashboard.client import AdminClient, admin_client, offers_changes, shows_api_errors
from dashboard.formats import NO_DATA, count, or_missing, usd
from dashboard.schemas import ApiKey, Team, UsageRow
from dashboard.widgets.downloads import usage_csv_button
from dashboard.widgets.flash import changed, show_flash
from dashboard.widgets.periods import period_start

KEYLESS = 0  # the ledger's rollups count requests sent without a key under key 0
TOP_USERS = 10


def _spent(key: ApiKey, usage: dict[int | None, UsageRow]) -> float:
    row = usage.get(key.id)
    return row.cost_usd if row else 0.0


def _table(keys: list[ApiKey], usage: dict[int | None, UsageRow], teams: dict[int, str]) -> None:
    rows = []
    for key in keys:
        spent = _spent(key, usage)
        row = usage.get(key.id)
        rows.append(
            {
                "id": key.id,
                "name": key.name,
                "prefix": key.key_prefix,
                "team": teams.get(key.team_id, NO_DATA) if key.team_id else NO_DATA,
                "requests (30 days)": count(row.requests if row else 0),
                "output tokens (30 days)": count(row.completion_tokens if row else 0),
                "spent (30 days)": usd(spent),
                "budget": usd(key.budget_usd),
                "budget period": or_missing(key.budget_period if key.budget_usd else None),
                "budget used": f"{spent / key.budget_usd:.0%}" if key.budget_usd else NO_DATA,
                "revoked": f"{key.revoked_at:%Y-%m-%d %H:%M} UTC" if key.revoked_at else NO_DATA,
            }
        )
    st.dataframe(rows, hide_index=True)


def _teams(teams: list[Team], usage: dict[int | None, UsageRow]) -> None:
    """Each team's keys and what they spent in it."""
    st.subheader("Teams")
    if not teams:
        st.caption("No teams yet: create one below, then give it keys.")
        return
    rows = []
    for team in teams:
        row = usage.get(team.id)
        rows.append(
            {
                "id": team.id,
                "team": team.name,
                "keys": team.keys,
                "requests (30 days)": count(row.requests if row else 0),
                "output tokens (30 days)": count(row.completion_tokens if row else 0),
                "spent (30 days)": usd(row.cost_usd if row else 0.0),
                "budget": usd(team.budget_usd),
                "budget period": or_missing(team.budget_period if team.budget_usd else None),
                "weight": team.weight,
                "priority": team.priority,
            }
        )
    st.dataframe(rows, hide_index=True)
    st.caption(
        "A team's spend is what its keys spent while in it: the capacity cost the ledger "
        "priced each request at, summed (GET /admin/v1/savings?group_by=team). Its budget "
        "holds over all its keys beside each key's own. While a model's backends are full, "
        "its requests wait their turn by its weight and priority (docs/teams.md)."
    )


def _top_users(rows: list[UsageRow]) -> None:
    """The end users who cost the most, from the `user` field or the user header."""
    named = sorted((r for r in rows if r.end_user), key=lambda r: r.cost_usd, reverse=True)
    if not named:
        return
    st.subheader(f"Top end users (30 days, {min(len(named), TOP_USERS)} of {len(named)})")
    st.dataframe(
        [
            {
                "end user": r.end_user,
                "requests": count(r.requests),
                "output tokens": count(r.completion_tokens),
                "spent": usd(r.cost_usd),
            }
            for r in named[:TOP_USERS]
        ],
        hide_index=True,
    )


def _keyless(row: UsageRow | None) -> None:
    """Traffic that came without an API key (when the gateway does not require one)."""
    if row is None or not row.requests:
        return
    st.subheader("Without an API key (30 days)")
    cols = st.columns(3)
    cols[0].metric("Requests", f"{row.requests:,}")
    cols[1].metric("Output tokens", f"{row.completion_tokens:,}")
    cols[2].metric("Capacity cost", usd(row.cost_usd))
    st.caption(
        "Requests sent with no key: the gateway accepts them when "
        "DRAFTGATE_REQUIRE_API_KEY is off (as under draftgate up). A request with a key "
        "counts against that key and its budget above."
    )


def _download(api: AdminClient, keys: list[ApiKey]) -> None:
    """Every usage record of the last 30 days, of all keys or one."""
    st.subheader("Usage records")
    labels: dict[str, int | None] = {"all keys": None} | {
        f"{k.id}: {k.name} ({k.key_prefix}…)": k.id for k in keys
    }
    chosen = st.selectbox("Records of", list(labels), key="usage-csv-of")
    usage_csv_button(api, period_start("30 days"), "30 days", labels[chosen], "keys-usage-csv")


def _create_form(api: AdminClient, teams: list[Team]) -> None:
    with st.form("create-key", clear_on_submit=True):
        st.subheader("Create a key")
        name = st.text_input("Name", key="key-name")
        budget = st.number_input("Budget, USD per month (0: none)", 0.0, 1e6, 0.0, key="key-budget")
        choices: dict[str, int | None] = {"none": None} | {t.name: t.id for t in teams}
        team = st.selectbox("Team", list(choices), key="key-team")
        if not st.form_submit_button("Create key", key="key-create"):
            return
    created = api.create_key(name, float(budget) or None, choices[team])
    message = f"Created key {created.id} ({created.name}). Copy it now: it is shown only once."
    changed(message, secret=created.key)


def _team_form(api: AdminClient) -> None:
    with st.form("create-team", clear_on_submit=True):
        st.subheader("Create a team")
        name = st.text_input("Team name", key="team-name")
        budget = st.number_input(
            "Team budget, USD per month over its keys (0: none)", 0.0, 1e6, 0.0, key="team-budget"
        )
        weight = st.number_input(
            "Weight: its share of a full model beside other teams'", 0.01, 1000.0, 1.0,
            key="team-weight",
        )  # fmt: skip
        priority = st.number_input(
            "Priority: lower goes first", -100, 100, 0, step=1, key="team-priority"
        )
        if not st.form_submit_button("Create team", key="team-create"):
            return
    created = api.create_team(name, float(budget) or None, float(weight), int(priority))
    changed(f"Created team {created.id} ({created.name}): give it keys as you create them.")


def _revoke_form(api: AdminClient, keys: list[ApiKey]) -> None:
    live = [k for k in keys if k.revoked_at is None]
    if not live:
        return
    st.subheader("Revoke a key")
    labels = {f"{k.id}: {k.name} ({k.key_prefix}…)": k.id for k in live}
    label = st.selectbox("Key", list(labels), key="revoke-key")
    if st.button("Revoke", key="revoke"):
        api.revoke_key(labels[label])
        changed(f"Revoked key {labels[label]}")


@shows_api_errors
def render() -> None:
    """The Teams and keys page."""
    st.title("Teams and keys")
    show_flash()
    api = admin_client()
    revoked = st.toggle(
        "Show revoked keys",
        key="keys-show-revoked",
        help="A revoked key's usage stays its own: `draftgate up` revokes the previous "
        "start's demo key, and its traffic is listed under it.",
    )
    keys, teams, since = api.keys(include_revoked=revoked), api.teams(), period_start("30 days")
    usage = {row.key: row for row in api.usage(since, "key").data}
    if keys:
        _table(keys, usage, {t.id: t.name for t in teams})
    else:
        st.info("No API keys yet. Create one below; clients send it as a bearer token.")
    _keyless(usage.get(KEYLESS))
    _teams(teams, {row.team: row for row in api.usage(since, "team").data})
    _top_users(api.usage(since, "user").data)
    _download(api, keys)
    if offers_changes(api):
        _revoke_form(api, keys)
        _create_form(api, teams)
        _team_form(api)
