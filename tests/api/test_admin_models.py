"""Admin API for models and policies (model names contain `/`)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_admin_backends import EAGLE3, assert_envelope

MODEL = "Qwen/Qwen3-8B"


async def test_backend_creates_its_model_with_the_auto_policy(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    model = (await client.get(f"/admin/v1/models/{MODEL}")).json()
    assert model["name"] == MODEL
    assert model["policy"] == {
        "mode": "auto",
        "method": None,
        "k": None,
        "itl_objective_ms": None,
        "explore_fraction": 0.0,
        "rules": [],
        "classes": {},
        "drafter_trial": None,
        "lossless_quarantine": False,
    }


async def test_put_policy_pins_a_method_and_is_audited(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    policy = {"mode": "pinned", "method": "eagle3", "k": 3, "itl_objective_ms": 25.0}
    response = await client.put(f"/admin/v1/models/{MODEL}/policy", json=policy)
    assert response.status_code == 200, response.text
    stored = (await client.get(f"/admin/v1/models/{MODEL}/policy")).json()
    expected = {
        "explore_fraction": 0.0,
        "rules": [],
        "classes": {},
        "drafter_trial": None,
        "lossless_quarantine": False,
    }
    assert stored == {**policy, **expected}
    [entry, *_] = (await client.get("/admin/v1/audit", params={"resource_type": "model"})).json()[
        "data"
    ]
    assert (entry["action"], entry["resource_id"]) == ("update", MODEL)
    assert entry["before"]["policy"]["mode"] == "auto"
    assert entry["after"]["policy"]["method"] == "eagle3"
    assert response.json()["warnings"] == []  # the backend runs eagle3 at K=3


async def test_put_policy_warns_of_a_method_or_k_no_backend_runs(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    url = f"/admin/v1/models/{MODEL}/policy"
    other_k = await client.put(url, json={"mode": "pinned", "method": "eagle3", "k": 5})
    assert other_k.status_code == 200, other_k.text
    assert other_k.json()["warnings"] == [
        f"pinned: no enabled backend of {MODEL} runs eagle3 at K=5 (it runs at K=3); its "
        "requests go to those"
    ]
    assert other_k.json()["policy"]["k"] == 5  # saved all the same
    rule = {"when": ["structured_output"], "method": "dflash", "k": 7}
    body = {"mode": "pinned", "method": "p-eagle", "rules": [rule]}
    missing = (await client.put(url, json=body)).json()["warnings"]
    assert missing == [
        f"{what}: no enabled backend of {MODEL} runs {method}; its requests go to the other "
        "methods' backends until one does"
        for what, method in (("pinned", "p-eagle"), ("rule 1", "dflash"))
    ]
    await client.patch(f"/admin/v1/backends/{EAGLE3['name']}", json={"enabled": False})
    disabled = await client.put(url, json={"mode": "pinned", "method": "eagle3"})
    assert len(disabled.json()["warnings"]) == 1  # a disabled backend serves nothing
    assert (await client.put(url, json={"mode": "auto"})).json()["warnings"] == []


async def test_rules_are_stored_in_order_and_audited(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    rules = [
        {"when": ["structured_output"], "method": "plain", "k": None},
        {"when": ["class:batch", "temperature_above:0.7"], "method": "eagle3", "k": 3},
    ]
    response = await client.put(f"/admin/v1/models/{MODEL}/policy", json={"rules": rules})
    assert response.status_code == 200, response.text
    assert (await client.get(f"/admin/v1/models/{MODEL}/policy")).json()["rules"] == rules
    [entry, *_] = (await client.get("/admin/v1/audit", params={"resource_type": "model"})).json()[
        "data"
    ]
    assert entry["before"]["policy"]["rules"] == []
    assert entry["after"]["policy"]["rules"] == rules


async def test_pinning_another_method_starts_a_gradual_move(client: httpx.AsyncClient) -> None:
    """Auto serves plain (nothing measured); pinning EAGLE-3 moves the traffic in steps of
    the default 25% every 15 s, shown on the model and in the audit entry; a change that
    keeps the method keeps the move, and `?immediate=true` ends it."""
    await client.post("/admin/v1/backends", json=EAGLE3)
    plain = {**EAGLE3, "name": "qwen-plain", "method": "plain", "k": None, "drafter": None}
    assert (await client.post("/admin/v1/backends", json=plain)).status_code == 201
    url = f"/admin/v1/models/{MODEL}/policy"
    response = await client.put(url, json={"mode": "pinned", "method": "eagle3", "k": 3})
    move = response.json()["move"]
    assert {k: move[k] for k in ("source", "target", "step_share", "step_s", "target_share")} == {
        "source": "plain",
        "target": "eagle3",
        "step_share": 0.25,
        "step_s": 15.0,
        "target_share": 0.25,
    }
    assert (await client.get(f"/admin/v1/models/{MODEL}")).json()["move"] == move
    [entry, *_] = (await client.get("/admin/v1/audit", params={"resource_type": "model"})).json()[
        "data"
    ]
    assert entry["after"]["move"]["from"] == "plain"
    kept = await client.put(
        url, json={"mode": "pinned", "method": "eagle3", "explore_fraction": 0.1}
    )
    assert kept.json()["move"] == move
    ended = await client.put(
        url, params={"immediate": "true"}, json={"mode": "pinned", "method": "eagle3"}
    )
    assert ended.json()["move"] is None
    back = await client.put(
        url, params={"immediate": "true"}, json={"mode": "pinned", "method": "plain"}
    )
    assert back.json()["move"] is None


async def test_put_policy_creates_an_unknown_model(client: httpx.AsyncClient) -> None:
    response = await client.put("/admin/v1/models/org/new-model/policy", json={"mode": "auto"})
    assert response.status_code == 200
    names = [m["name"] for m in (await client.get("/admin/v1/models")).json()["data"]]
    assert names == ["org/new-model"]


@pytest.mark.parametrize(
    ("policy", "param", "fragment"),
    [
        ({"mode": "pinned"}, "body", "pinned policy needs a method"),
        ({"mode": "sometimes"}, "mode", "'auto' or 'pinned'"),
        ({"mode": "auto", "explore_fraction": 1.5}, "explore_fraction", "less than or equal"),
        ({"mode": "pinned", "method": "dflash", "k": 0}, "k", "greater than or equal to 1"),
        ({"mode": "pinned", "method": "plain", "k": 2}, "body", "'plain' takes no k"),
        ({"mode": "auto", "itl_objective_ms": -1}, "itl_objective_ms", "greater than 0"),
        ({"rules": [{"when": ["json"], "method": "plain"}]}, "rules.0.when", "structured_output"),
        ({"rules": [{"when": ["logprobs"], "method": "plain", "k": 1}]}, "rules.0", "no k"),
        ({"rules": [{"when": [], "method": "plain"}]}, "rules.0.when", "at least 1"),
    ],
)
async def test_invalid_policy_is_422(
    client: httpx.AsyncClient, policy: dict[str, Any], param: str, fragment: str
) -> None:
    response = await client.put(f"/admin/v1/models/{MODEL}/policy", json=policy)
    assert fragment in assert_envelope(response, 422, param=param)


async def test_create_model_conflicts_and_deletes(client: httpx.AsyncClient) -> None:
    created = await client.post("/admin/v1/models", json={"name": "a/b"})
    assert created.status_code == 201
    assert_envelope(await client.post("/admin/v1/models", json={"name": "a/b"}), 409)
    assert (await client.delete("/admin/v1/models/a/b")).status_code == 204
    assert_envelope(await client.get("/admin/v1/models/a/b"), 404, param="model")
    assert_envelope(await client.get("/admin/v1/models/a/b/policy"), 404)


async def test_model_with_backends_cannot_be_deleted(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    message = assert_envelope(await client.delete(f"/admin/v1/models/{MODEL}"), 409)
    assert "qwen-eagle3" in message
    assert (await client.get(f"/admin/v1/models/{MODEL}")).status_code == 200
