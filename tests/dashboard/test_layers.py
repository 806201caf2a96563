"""The dashboard's only data source is the admin API: loading its pages loads no server-side
package, however indirectly (tests/unit/test_layers.py holds the direct imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dashboard

DASHBOARD = Path(dashboard.__file__).parent
SERVER_SIDE = {"gateway", "backends", "planner"}


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
