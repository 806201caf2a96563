"""The relay is a plain ASGI callable: importing it loads no web framework at all.

The layers test reads the relay's own imports; this one runs them, so a framework pulled
in from below (an error class, a shape) is seen too."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

WEB = ["fastapi", "starlette"]
REPORT = "import json, sys; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"


def frameworks_loaded_by(module: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}; {REPORT}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = json.loads(done.stdout)
    return [name for name in WEB if name in loaded]


@pytest.mark.parametrize("module", ["gateway.relay.proxy", "gateway.errors"])
def test_importing_loads_no_web_framework(module: str) -> None:
    assert frameworks_loaded_by(module) == []


def test_the_check_sees_a_framework() -> None:
    assert frameworks_loaded_by("gateway.error_handlers") == WEB
