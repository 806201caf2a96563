"""Held-out sweeps: well formed, predicted through the contract, and never calibrated on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planner import heldout

ROOT = Path(__file__).parents[2]


def test_every_sweep_can_be_given_to_the_contract() -> None:
    sweeps = heldout.sweeps()
    assert len(sweeps) >= 5
    for key, sweep in sweeps.items():
        assert len(sweep) >= 2, key
        first = sweep[0]
        assert first.speedup or (
            first.plain_output_tokens_per_s and first.method_output_tokens_per_s
        )
        raw = heldout.scenario(sweep)
        assert raw["concurrency"] == [p.concurrency for p in sweep]
        assert 1 <= raw["acceptance_length"] <= first.k + 1, key


def test_a_sweep_with_throughputs_starts_from_its_measurements() -> None:
    sweep = next(s for s in heldout.sweeps().values() if s[0].plain_output_tokens_per_s)
    checks = list(heldout.checks(sweep))
    assert [c.point.concurrency for c in checks] == [p.concurrency for p in sweep[1:]]
    raw = heldout.scenario(sweep)
    plain, method = (m["output_tokens_per_s"] for m in raw["measurements"])
    assert (plain, method) == (
        sweep[0].plain_output_tokens_per_s,
        sweep[0].method_output_tokens_per_s,
    )
    assert all(c.naive == pytest.approx(sweep[0].published_speedup) for c in checks)
    assert all(c.error == abs(c.predicted / c.point.published_speedup - 1) for c in checks)


def test_only_the_accuracy_report_reads_the_held_out_data() -> None:
    readers = set()
    for package in ("planner", "gateway", "backends", "dashboard", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = {
                alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom | ast.Import)
                for alias in node.names
            }
            modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            if (
                "heldout" in names
                or "planner.heldout" in names | modules
                or "heldout.yaml" in path.read_text()
            ):
                readers.add(path.relative_to(ROOT).as_posix())
    assert readers == {"planner/accuracy.py", "planner/heldout.py"}
