"""The dashboard's only data source: a small typed client of the gateway's admin REST API.

Reads go through a TTL cache shared by every session; a write clears it, so the page that
made a change shows it on its next run. Errors of the API become `AdminApiError` with the
API's own message, which pages show with `st.error`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import streamlit as st
from pydantic import BaseModel, ValidationError

from dashboard.schemas import (
    Accuracy,
    ApiKey,
    AuditEntry,
    Backend,
    Benchmark,
    CreatedKey,
    Curves,
    DecodingMethod,
    Fleet,
    Gpu,
    LosslessReport,
    Measurement,
    MethodRendering,
    ModelInfo,
    Plan,
    Policy,
    PolicySaved,
    Pool,
    Price,
    Spend,
    Team,
    Usage,
)
from dashboard.settings import DashboardSettings

CACHE_TTL_S = 5.0  # live panels refresh within this; one read per widget per rerun is too many
Params = tuple[tuple[str, str], ...]
RecordT = TypeVar("RecordT", bound=BaseModel)


class AdminApiError(Exception):
    """The admin API refused a call, or could not be reached; `message` says why."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code  # the API's answer; None when it could not be reached


def _error_message(response: httpx.Response) -> str:
    try:
        detail = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = response.text[:200] or response.reason_phrase
    return f"the admin API answered {response.status_code}: {detail}"


def _send(http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One admin API call; its response, or AdminApiError."""
    try:
        response = http.request(method, f"/admin/v1{path}", **kwargs)
    except httpx.TransportError as exc:
        raise AdminApiError(f"cannot reach the gateway at {http.base_url}: {exc}") from None
    if response.status_code >= 400:
        raise AdminApiError(_error_message(response), response.status_code)
    return response


def _call(http: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    """One admin API call; its JSON body (None when empty), or AdminApiError."""
    response = _send(http, method, path, **kwargs)
    return response.json() if response.content else None


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def _cached_get(base_url: str, token: str, path: str, params: Params, _timeout_s: float) -> Any:
    """A GET's JSON, shared for CACHE_TTL_S by every session with the same URL and token."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=_timeout_s) as http:
        return _call(http, "GET", path, params=dict(params))


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def _cached_post(base_url: str, token: str, path: str, body: str, _timeout_s: float) -> Any:
    """The JSON of a POST that changes nothing (a rendering), cached like a GET by its body."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=_timeout_s) as http:
        return _call(http, "POST", path, content=body)


def refresh_reads() -> None:
    """Forget every cached read: the next one asks the admin API again."""
    _cached_get.clear()
    _cached_post.clear()


def _parse(model: type[RecordT], body: Any) -> RecordT:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise AdminApiError(f"unexpected answer from the admin API: {exc}") from None


def _path_name(name: str) -> str:
    """A model or backend name inside a path (model names may contain `/`)."""
    return quote(name, safe="/")


def signed_in_person(header: str) -> dict[str, str]:
    """The login proxy's header naming the person this page runs for, to forward with their
    changes (empty: the header is off, or not sent, or no page is running)."""
    name = header.strip().lower()
    if not name or not st.runtime.exists():
        return {}
    value = st.context.headers.get(name)
    return {name: value} if value else {}


class AdminClient:
    """Typed calls of the admin API at `base_url` with the admin `token`; `person` (a login
    proxy's header and value) goes with every change, so the audit log names who made it."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        person: dict[str, str] | None = None,
    ) -> None:
        self.base_url, self._token, self._timeout_s = base_url.rstrip("/"), token, timeout_s
        self._person = person or {}

    def _get(self, path: str, **params: object) -> Any:
        pairs = tuple((k, str(v)) for k, v in params.items() if v is not None)
        return _cached_get(self.base_url, self._token, path, pairs, self._timeout_s)

    def _post_read(self, path: str, body: dict[str, object]) -> Any:
        """A POST that only computes an answer: cached, and it leaves other reads cached."""
        text = json.dumps(body, sort_keys=True)
        return _cached_post(self.base_url, self._token, path, text, self._timeout_s)

    def _list(self, model: type[RecordT], path: str, **params: object) -> list[RecordT]:
        return [_parse(model, item) for item in self._get(path, **params)["data"]]

    def _write(self, method: str, path: str, body: object = None) -> Any:
        """A change: sent at once, then every cached read is dropped so pages show it."""
        headers = {"Authorization": f"Bearer {self._token}", **self._person}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=self._timeout_s) as http:
            answer = _call(http, method, path, json=body)
        refresh_reads()
        return answer

    # --- reads ---

    def scope(self) -> str:
        """What this dashboard's token may do: `read` or `admin` (GET /whoami)."""
        scope: str = self._get("/whoami")["scope"]
        return scope

    def backends(self) -> list[Backend]:
        return self._list(Backend, "/backends")

    def pools(self) -> list[Pool]:
        return self._list(Pool, "/pools")

    def models(self) -> list[ModelInfo]:
        return self._list(ModelInfo, "/models")

    def prices(self) -> list[Price]:
        return self._list(Price, "/prices")

    def gpus(self) -> list[Gpu]:
        """The GPU types the planner knows (its catalog), in catalog order."""
        return self._list(Gpu, "/gpus")

    def keys(self, include_revoked: bool = False) -> list[ApiKey]:
        return self._list(ApiKey, "/keys", include_revoked=include_revoked or None)

    def teams(self) -> list[Team]:
        return self._list(Team, "/teams")

    def benchmarks(self) -> list[Benchmark]:
        return self._list(Benchmark, "/benchmarks")

    def audit(self, resource_type: str, resource_id: str, limit: int = 10) -> list[AuditEntry]:
        return self._list(
            AuditEntry, "/audit", resource_type=resource_type, resource_id=resource_id, limit=limit
        )

    def usage(
        self, start: dt.datetime, group_by: str = "model,method", end: dt.datetime | None = None
    ) -> Usage:
        """Ledger totals (requests, tokens, cost, savings) in [start, end or now), per group."""
        period = {"from": start.isoformat(), "to": end.isoformat() if end else None}
        return _parse(Usage, self._get("/savings", group_by=group_by, **period))

    def usage_csv(self, start: dt.datetime, key: int | None = None) -> bytes:
        """Every usage record since `start` (of one key), as the API's CSV."""
        params = {"from": start.isoformat(), "format": "csv"}
        if key is not None:
            params["key"] = str(key)
        headers = {"Authorization": f"Bearer {self._token}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=self._timeout_s) as http:
            return _send(http, "GET", "/usage", params=params).content

    def curves(self, model: str) -> Curves:
        """The curves that price the model's requests now, with their bands."""
        return _parse(Curves, self._get("/curves", model=model))

    def spend(self, start: dt.datetime, price_kind: str = "on-demand") -> Spend:
        """GPU-hours each backend was held since `start`, priced at `price_kind`."""
        body = self._get("/spend", price_kind=price_kind, **{"from": start.isoformat()})
        return _parse(Spend, body)

    def fleet(
        self,
        model: str,
        start: dt.datetime,
        price_kind: str = "on-demand",
        objective_ms: float | None = None,
    ) -> Fleet:
        """The model's bill since `start`, and fleets sized for its traffic per method (for
        the policy's ITL objective, or a what-if `objective_ms`)."""
        body = self._get(
            "/fleet",
            model=model,
            price_kind=price_kind,
            objective_ms=objective_ms,
            **{"from": start.isoformat()},
        )
        return _parse(Fleet, body)

    def plan(self, model: str, gpu: str, **options: object) -> Plan:
        """The planner for `model` on `gpu` (options: gpu_count, price_kind, workload, ...)."""
        return _parse(Plan, self._get("/plan", model=model, gpu=gpu, **options))

    def measurements(self, limit: int = 20) -> list[Measurement]:
        """The newest stored measurements, newest first."""
        return self._list(Measurement, "/measurements", limit=limit)

    def lossless(self, model: str, start: dt.datetime) -> LosslessReport:
        """The lossless watchdog's checks of `model` since `start`: each serving configuration's
        divergences from its replays, the model's floor, and the replays' cost."""
        return _parse(
            LosslessReport, self._get("/lossless", model=model, **{"from": start.isoformat()})
        )

    def accuracy(self) -> Accuracy:
        return _parse(Accuracy, self._get("/accuracy"))

    def methods(self) -> list[DecodingMethod]:
        """The decoding methods a backend may declare, in catalog order, with what each needs."""
        return self._list(DecodingMethod, "/methods")

    def render_method(
        self,
        model: str,
        method: str,
        *,
        k: int | None = None,
        drafter: str | None = None,
        k_per_batch_size: list[list[int]] | None = None,
        gpu_count: int = 1,
    ) -> MethodRendering:
        """`vllm serve` and a compose file for a method spec; AdminApiError 422 if invalid."""
        options: dict[str, object] = {}
        if k_per_batch_size is not None:  # vLLM's K per batch size: [[batch from, to, K], ...]
            options["num_speculative_tokens_per_batch_size"] = k_per_batch_size
        body: dict[str, object] = {
            "model": model,
            "method": method,
            "k": k,
            "drafter": drafter,
            "speculative_options": options,
            "gpu_count": gpu_count,
        }
        return _parse(MethodRendering, self._post_read("/methods/render", body))

    # --- changes ---

    def set_policy(self, model: str, policy: Policy, immediate: bool = False) -> PolicySaved:
        body = policy.model_dump(mode="json")
        path = f"/models/{_path_name(model)}/policy" + ("?immediate=true" if immediate else "")
        return _parse(PolicySaved, self._write("PUT", path, body))

    def add_backend(self, fields: dict[str, object]) -> Backend:
        return _parse(Backend, self._write("POST", "/backends", fields))

    def set_backend_enabled(self, name: str, enabled: bool) -> Backend:
        body = {"enabled": enabled}
        return _parse(Backend, self._write("PATCH", f"/backends/{_path_name(name)}", body))

    def remove_backend(self, name: str) -> None:
        self._write("DELETE", f"/backends/{_path_name(name)}")

    def create_key(
        self, name: str, budget_usd: float | None, team_id: int | None = None
    ) -> CreatedKey:
        body = {"name": name, "budget_usd": budget_usd, "team_id": team_id}
        return _parse(CreatedKey, self._write("POST", "/keys", body))

    def create_team(
        self, name: str, budget_usd: float | None, weight: float = 1.0, priority: int = 0
    ) -> Team:
        body = {"name": name, "budget_usd": budget_usd, "weight": weight, "priority": priority}
        return _parse(Team, self._write("POST", "/teams", body))

    def revoke_key(self, key_id: int) -> None:
        self._write("DELETE", f"/keys/{key_id}")

    def create_price(self, body: dict[str, object]) -> Price:
        return _parse(Price, self._write("POST", "/prices", body))

    def update_price(self, price_id: int, body: dict[str, object]) -> Price:
        return _parse(Price, self._write("PATCH", f"/prices/{price_id}", body))

    def delete_price(self, price_id: int) -> None:
        self._write("DELETE", f"/prices/{price_id}")

    def start_benchmark(self, backend: str, concurrency: list[int], requests: int) -> Benchmark:
        body = {"backend": backend, "concurrency": concurrency, "requests_per_level": requests}
        return _parse(Benchmark, self._write("POST", "/benchmarks", body))


def admin_client(settings: DashboardSettings | None = None) -> AdminClient:
    """The client the pages use, from DRAFTGATE_* settings: the read token, or the admin
    token when `dashboard_admin` is on; AdminApiError without the one needed."""
    settings = settings or DashboardSettings()
    if settings.dashboard_admin:
        token = settings.admin_token
        if token is None:
            raise AdminApiError("dashboard_admin is on but DRAFTGATE_ADMIN_TOKEN is not set")
    else:
        token = settings.admin_read_token
        if token is None:
            raise AdminApiError(
                "no read token: set DRAFTGATE_ADMIN_READ_TOKEN to the gateway's read token "
                "(or start the dashboard with --admin, behind a login, to act as admin)"
            )
    return AdminClient(
        settings.dashboard_gateway_url,
        token.get_secret_value(),
        timeout_s=settings.dashboard_timeout_s,
        person=signed_in_person(settings.admin_user_header),
    )


READ_ONLY_NOTE = (
    "Read-only: this dashboard runs with the gateway's read token. Changes go through the "
    "admin API, or a dashboard started with `--admin` behind a login."
)


def offers_changes(api: AdminClient) -> bool:
    """Whether the page may show a form that changes something; says why not if not."""
    if api.scope() == "admin":
        return True
    st.caption(READ_ONLY_NOTE)
    return False


Page = Callable[[], None]


def shows_api_errors(render: Page) -> Page:
    """Run a page, showing an admin API failure as a message instead of a traceback."""

    @functools.wraps(render)
    def guarded() -> None:
        try:
            render()
        except AdminApiError as exc:
            st.error(exc.message)

    return guarded
