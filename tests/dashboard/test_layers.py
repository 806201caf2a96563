"""The dashboard's only data source is the admin API: it imports no server-side package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dashboard

DASHBOARD = Path(dashboard.__file__).parent
SERVER_SIDE = {"gateway", "backends", "planner"}


def _imported_packages(source: Path) -> set[str]:
    """Top-level packages a module imports (relative imports stay inside the dashboard)."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_dashboard_module_imports_the_gateway_backends_or_planner() -> None:
    offenders = {
        str(path.relative_to(DASHBOARD.parent)): sorted(_imported_packages(path) & SERVER_SIDE)
        for path in sorted(DASHBOARD.rglob("*.py"))
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_loading_every_page_loads_no_server_side_package() -> None:
    pages = sorted(p.stem for p in (DASHBOARD / "app_pages").glob("*.py") if p.stem != "__init__")
    script = (
        "import sys\n"
        + "".join(f"import dashboard.app_pages.{page}\n" for page in pages)
        + "import dashboard.client, dashboard.charts, dashboard.schemas, dashboard.settings\n"
        + f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(SERVER_SIDE)!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=DASHBOARD.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
