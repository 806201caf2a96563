"""The house plan as a test: which package may import which, and no import circles.

Read from the source with `ast` (every import: top-level, inside functions and under
TYPE_CHECKING), so a wall holds whether or not the import would run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "planner", "backends", "dashboard")
WEB = ("fastapi", "starlette")
# Every module of the gateway stands in exactly one layer, from the ground floor up.
LAYERS = {
    # what everyone stands on: settings, errors, the registry and curves, the ledger and
    # limits (and their state shared over a replica's workers), metrics, the database, the
    # shapes, the OpenAI usage vocabulary, pure request policy and where stored responses live
    "ground floor": ("gateway.settings", "gateway.errors", "gateway.registry", "gateway.curves",
                     "gateway.acceptance", "gateway.drafters", "gateway.context",
                     "gateway.accounting", "gateway.ledger_entry", "gateway.rollups",
                     "gateway.access_log",
                     "gateway.limits", "gateway.metrics", "gateway.apikeys",
                     "gateway.urls", "gateway.usage", "gateway.db", "gateway.schemas",
                     "gateway.policy", "gateway.server.inflight", "gateway.server.shared_budget",
                     "gateway.server.http_limits", "gateway.server.private",
                     "gateway.homes"),
    "events": ("gateway.events",),
    "hot path": ("gateway.relay",),
    "services": ("gateway.services",),
    "control loops": ("gateway.control",),
    "worker processes": ("gateway.server.replica", "gateway.server.workers"),
    "routes": ("gateway.admin", "gateway.deps", "gateway.health", "gateway.openai_routes",
               "gateway.apidocs"),
    "app": ("gateway.app", "gateway.error_handlers"),
    "command": ("gateway.cli",),
}  # fmt: skip
FOUNDATION = LAYERS["ground floor"]
ABOVE_FOUNDATION = tuple(p for name, ps in LAYERS.items() if name != "ground floor" for p in ps)
PACKAGE_ROOTS = {"gateway", "gateway.server"}  # package `__init__`s holding no code


@dataclass(frozen=True)
class Import:
    """One import statement's target module, where it stands."""

    importer: str  # dotted module name
    target: str  # dotted module name (a submodule when `from pkg import submodule`)
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, Path]:
    """Every module of the product's packages, by dotted name."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield Import(name, sub if sub in known else base, node.lineno)


def all_imports() -> list[Import]:
    files = source_files()
    known = set(files)
    return [i for name, path in files.items() for i in imports_of(name, path, known)]


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def crossings(importers: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    """Imports from modules under `importers` of modules under `forbidden`."""
    return [
        f"{i.importer}:{i.line} imports {i.target}"
        for i in all_imports()
        if within(i.importer, *importers) and within(i.target, *forbidden)
    ]


WALLS = {
    "the relay reads memory, never the database": (
        ("gateway.relay",),
        ("sqlalchemy", "gateway.db"),
    ),
    "the relay is a plain ASGI callable: no web framework, and nothing above it": (
        ("gateway.relay",),
        (*WEB, "gateway.deps", "gateway.admin", "gateway.control", "gateway.services"),
    ),
    "the ground floor (registry, ledger, limits, db, shapes) knows none of the floors above": (
        FOUNDATION,
        ABOVE_FOUNDATION,
    ),
    "services and control loops know no HTTP framework, routes or command": (
        ("gateway.services", "gateway.control"),
        (*WEB, "gateway.admin", "gateway.cli"),
    ),
    "the control loops steer through services, never through the hot path": (
        ("gateway.control",),
        ("gateway.relay",),
    ),
    "services are reads and audited changes: no loop, no hot path": (
        ("gateway.services",),
        ("gateway.relay", "gateway.control"),
    ),
    "the database knows no domain": (
        ("gateway.db",),
        ("gateway.curves", "gateway.registry", "gateway.policy", "planner"),
    ),
    "events never reach into the hot path": (
        ("gateway.events",),
        ("gateway.relay",),
    ),
    "admin routes never import the control loops": (
        ("gateway.admin",),
        ("gateway.control",),
    ),
    "the planner is pure": (
        ("planner",),
        ("gateway", "backends", "dashboard", "sqlalchemy", "fastapi", "httpx"),
    ),
    "the dashboard reads only the admin API": (
        ("dashboard",),
        ("gateway", "backends", "planner", "sqlalchemy"),
    ),
    "the simulator stands apart from the gateway": (
        ("backends.sim",),
        ("gateway", "dashboard"),
    ),
}


@pytest.mark.parametrize("wall", WALLS)
def test_wall(wall: str) -> None:
    importers, forbidden = WALLS[wall]
    assert crossings(importers, forbidden) == []


def layers_of(module: str) -> list[str]:
    return [name for name, places in LAYERS.items() if within(module, *places)]


def test_every_gateway_module_stands_in_exactly_one_layer() -> None:
    modules = [m for m in source_files() if within(m, "gateway") and m not in PACKAGE_ROOTS]
    placed = {m: layers_of(m) for m in modules}
    assert {m: names for m, names in placed.items() if len(names) != 1} == {}


def test_a_module_in_no_layer_is_seen() -> None:
    assert layers_of("gateway.somewhere_new") == []
    assert layers_of("gateway.server.replica") == ["worker processes"]


def test_the_simulator_takes_only_vllms_vocabulary_from_backends() -> None:
    # The method catalog and vLLM's metric names have one definition each (backends.methods,
    # backends.vllm_metrics); the simulator speaks them, and nothing else of backends/.
    shared = ("backends.methods", "backends.vllm_metrics")
    found = [
        f"{i.importer}:{i.line} imports {i.target}"
        for i in all_imports()
        if within(i.importer, "backends.sim")
        and within(i.target, "backends")
        and not within(i.target, "backends.sim", *shared)
    ]
    assert found == []


def test_only_the_app_mounts_the_admin_routes() -> None:
    importers = {
        i.importer
        for i in all_imports()
        if within(i.target, "gateway.admin") and not within(i.importer, "gateway.admin")
    }
    assert importers == {"gateway.app"}


def test_nothing_in_the_server_imports_the_command() -> None:
    found = [
        f"{i.importer}:{i.line} imports {i.target}"
        for i in all_imports()
        if within(i.target, "gateway.cli") and not within(i.importer, "gateway.cli")
    ]
    assert found == []


def import_graph() -> dict[str, set[str]]:
    """Module → the product modules it imports (the packages' own imports excluded)."""
    known = set(source_files())
    graph: dict[str, set[str]] = {name: set() for name in known}
    for i in all_imports():
        if i.target in known and i.target != i.importer:
            graph[i.importer].add(i.target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_a_broken_wall_is_seen(tmp_path: Path) -> None:
    # The reader itself: a relay module importing the database would be reported.
    sample = tmp_path / "proxy.py"
    sample.write_text("from gateway.db import queries\nimport sqlalchemy\n")
    found = list(imports_of("gateway.relay.proxy", sample, {"gateway.db.queries"}))
    assert [(i.target, i.line) for i in found] == [("gateway.db.queries", 1), ("sqlalchemy", 2)]


def test_only_services_write_the_audit_log() -> None:
    # One function per audited change, so validation and audit entries agree by construction.
    found = [
        f"{name}:{node.lineno}"
        for name, path in source_files().items()
        if not within(name, "gateway.services", "gateway.db")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "record_audit"
    ]
    assert found == []
