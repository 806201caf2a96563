"""`fleet.yaml` applied at start, idempotently."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.services.fleet import FleetError, load_fleet
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN

FLEET = """
models:
  - name: Qwen/Qwen3-8B
    policy: {mode: pinned, method: dflash, k: 7, explore_fraction: 0.05}
backends:
  - name: qwen-plain
    url: http://127.0.0.1:8101
    model: Qwen/Qwen3-8B
    method: plain
  - name: qwen-dflash
    url: http://127.0.0.1:8104
    model: Qwen/Qwen3-8B
    method: dflash
    k: 7
    drafter: z-lab/Qwen3-8B-DFlash-b16
    gpu_type: H100
prices:
  - {gpu_type: B200, usd_per_gpu_hour: 6.25, kind: on-demand, source: list price, date: 2026-11-01}
"""


async def _start(settings: Settings) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Start the app once; return its backends and its audit log."""
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers
        ) as client,
    ):
        backends = (await client.get("/admin/v1/backends")).json()["data"]
        audit = (await client.get("/admin/v1/audit")).json()["data"]
    return backends, audit


async def test_fleet_is_applied_once(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    settings = settings.model_copy(update={"fleet": path})

    backends, audit = await _start(settings)
    assert [(b["name"], b["method"], b["gpu_type"]) for b in backends] == [
        ("qwen-dflash", "dflash", "H100"),
        ("qwen-plain", "plain", "B200"),
    ]
    assert {e["actor"] for e in audit} == {"fleet"}
    assert len(audit) == 4  # model, two backends, price

    _, audit_again = await _start(settings)
    assert audit_again == audit

    path.write_text(FLEET.replace("k: 7\n    drafter", "k: 5\n    drafter"))
    backends, audit = await _start(settings)
    assert next(b for b in backends if b["name"] == "qwen-dflash")["k"] == 5
    assert (audit[0]["action"], audit[0]["resource_id"]) == ("update", "qwen-dflash")
    assert len(audit) == 5


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("backends: [{name: x, model: m, method: plain}]", "backends.0.url: Field required"),
        ("models: [{name: m, policy: {mode: pinned}}]", "pinned policy needs a method"),
        ("prices: 3", "prices: Input should be a valid list"),
        ("backends: [", "not valid YAML"),
        ("extras: {}", "extras: Extra inputs are not permitted"),
    ],
)
def test_bad_fleet_file_names_file_and_field(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(content)
    with pytest.raises(FleetError, match=str(path)) as caught:
        load_fleet(path)
    assert fragment in str(caught.value)


def test_missing_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="cannot read fleet file"):
        load_fleet(tmp_path / "absent.yaml")
