"""The CLI's table of optional extras matches what pyproject.toml declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from gateway.cli.common import EXTRA_MODULES

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _distributions(extra: str) -> set[str]:
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements[extra]}


def test_every_extra_the_cli_names_lists_the_modules_pyproject_installs() -> None:
    for extra, modules in EXTRA_MODULES.items():
        assert _distributions(extra) == set(modules), extra
