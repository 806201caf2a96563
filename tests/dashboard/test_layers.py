"""The dashboard's only data source is the admin API: loading its pages loads no server-side
package, however indirectly (tests/unit/test_layers.py holds the direct imports); and its pages
folder holds exactly the pages the app lists."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import dashboard
from dashboard import app_pages, widgets

DASHBOARD = Path(dashboard.__file__).parent
SERVER_SIDE = {"gateway", "backends", "planner"}


def _modules(package: ModuleType) -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__))


def test_loading_every_page_loads_no_server_side_package() -> None:
    loaded = [f"{p.__name__}.{m}" for p in (app_pages, widgets) for m in _modules(p)]
    script = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in loaded)
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


def _pages_the_app_lists() -> list[str]:
    """The modules of app_pages whose `render` streamlit_app.py hands to `st.Page`."""
    tree = ast.parse((DASHBOARD / "streamlit_app.py").read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == app_pages.__name__
        for alias in node.names
    }
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    pages = [
        c.args[0] for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "Page"
    ]
    listed = [ast.unparse(page).removesuffix(".render") for page in pages]
    assert set(listed) <= imported, f"{listed}: each page is `<a module of app_pages>.render`"
    return listed


def test_the_pages_folder_holds_exactly_the_pages_the_app_lists() -> None:
    """Pieces several pages draw live in dashboard/widgets, not among the pages."""
    listed = _pages_the_app_lists()
    assert listed, "no st.Page found in streamlit_app.py"
    assert len(set(listed)) == len(listed)
    strays = set(_modules(app_pages)) ^ set(listed)
    assert not strays, f"in app_pages but not a page the app lists: {sorted(strays)}"
