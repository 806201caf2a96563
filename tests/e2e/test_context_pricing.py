"""A request priced at its own context, through a real gateway and simulator: a long prompt
pays for the KV cache its steps read beyond the curve's traffic's, a short one pays less,
plain's baseline carries plain's larger correction (one step per token), and the record
says by how much, so the cost can be recomputed."""

from __future__ import annotations

import math
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    price_gpu,
    sim_args,
    until,
)


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    [sim] = start_module_servers(sim_args("--method", "p-eagle", "--time-scale", "50"))
    server, _ = start_module_gateway([fleet_backend("pe", sim.base_url, "p-eagle")])
    price_gpu(server, ["p-eagle", "plain"])
    return server


def _ask(gateway: Server, words: int) -> dict[str, Any]:
    request_id = str(uuid.uuid4())
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0)
    client.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": f"{request_id} " + "word " * words}],
        max_tokens=64,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": request_id},
    )

    def record() -> list[dict[str, Any]]:
        rows = httpx.get(
            f"{gateway.base_url}/admin/v1/usage", params={"limit": 1000}, headers=ADMIN
        ).json()["data"]
        return [r for r in rows if r["client_request_id"] == request_id]

    return until(record, f"the record of {request_id}")[0]


def test_a_long_context_pays_for_its_kv_reads_and_plain_would_pay_more(gateway: Server) -> None:
    short, long = _ask(gateway, 20), _ask(gateway, 16_000)
    print(
        f"\nshort: {short['prompt_tokens']} prompt tokens, context {short['context_usd']:.3g} USD"
        f" (plain {short['baseline_context_usd']:.3g}); long: {long['prompt_tokens']}, context "
        f"{long['context_usd']:.3g} (plain {long['baseline_context_usd']:.3g})"
    )
    assert short["context_usd"] < 0 < long["context_usd"]
    assert short["baseline_context_usd"] < 0 < long["baseline_context_usd"]
    # one step per token for plain, about 1 / 3.7 as many for p-eagle
    assert long["baseline_context_usd"] > 2 * long["context_usd"]
    # the correction is in the cost: the output's price without it is the curve's, alike
    for r in (short, long):
        assert r["cost_usd"] > 0
        assert r["cost_error_usd"] > 0
    per_token = [(r["cost_usd"] - r["context_usd"]) / r["completion_tokens"] for r in (short, long)]
    prompt = [
        (r["prompt_tokens"] - (r["cached_prompt_tokens"] or 0)) * r["prompt_usd_per_mtok"] / 1e6
        for r in (short, long)
    ]
    output = [
        p - q / r["completion_tokens"]
        for p, q, r in zip(per_token, prompt, (short, long), strict=True)
    ]
    assert output[1] == pytest.approx(output[0], rel=0.05)  # the same load, the same curve
    assert long["usd_per_mtok"] > short["usd_per_mtok"]
    # recomputed from the API: the curve's context model, at the record's concurrency
    curves = httpx.get(
        f"{gateway.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
    ).json()["curves"]
    [model] = [c["context"] for c in curves if c["method"] == "p-eagle"]
    for r, each in zip((short, long), output, strict=True):
        c = float(r["concurrency"])
        slope, kv_share = (
            _at(model["slope"], c, name) for name in ("s_per_context_token", "kv_share")
        )
        context = r["prompt_tokens"] + r["completion_tokens"] / 2
        steps = r["completion_tokens"] / model["acceptance_length"]  # no spec block asked
        usd = (context - model["mean_context_tokens"]) * slope * steps * 6.0 / 3600
        floor = -kv_share * each * r["completion_tokens"]  # its whole KV share, at most
        assert r["context_usd"] == pytest.approx(max(usd, floor), rel=1e-6)


def _at(points: list[dict[str, float]], c: float, name: str) -> float:
    """`name` at c, log-linear between the curve's points (held past either end)."""
    xs, ys = [p["concurrency"] for p in points], [p[name] for p in points]
    c = max(c, 1.0)
    if c <= xs[0]:
        return ys[0]
    if c >= xs[-1]:
        return ys[-1]
    i = next(i for i, x in enumerate(xs) if x >= c)
    t = math.log(c / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])
