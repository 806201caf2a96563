"""Sizes as a test: no function over 60 lines, no file over 400 without saying why.

Read from the source with `ast`: a function's length runs from its `def` (decorators
aside) to its last line, docstring and comments included; a long file says why it is one
file in a comment right after its module docstring, starting `# Over 400 lines:`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "planner", "backends", "dashboard")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
REASON = "# Over 400 lines:"


def product_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def long_functions(source: str, name: str) -> list[str]:
    """Each function or method over the limit, as `name:line function (n lines)`."""
    out = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def says_why_it_is_long(source: str) -> bool:
    """The comment lines right after the module docstring hold one starting `REASON`."""
    tree = ast.parse(source)
    after = tree.body[0].end_lineno if ast.get_docstring(tree) is not None else 0
    for line in source.splitlines()[after or 0 :]:
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            return False
        if stripped.startswith(REASON):
            return True
    return False


def test_no_function_is_over_60_lines() -> None:
    found = [
        f for p in product_files() for f in long_functions(p.read_text(encoding="utf-8"), _name(p))
    ]
    assert not found, "split these into named parts:\n" + "\n".join(found)


def test_a_file_over_400_lines_says_why_it_is_one_file() -> None:
    found = []
    for path in product_files():
        source = path.read_text(encoding="utf-8")
        count = len(source.splitlines())
        if count > MAX_FILE_LINES and not says_why_it_is_long(source):
            found.append(f"{_name(path)} ({count} lines)")
    assert not found, f"split these, or say why after the docstring ({REASON} ...):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ('"""Doc."""\n\n# Over 400 lines: one class.\n\nimport os\n', True),
        ('"""Doc."""\n# a note\n# Over 400 lines: one class.\nimport os\n', True),
        ('"""Doc."""\n\nimport os\n# Over 400 lines: too late.\n', False),
        ("# Over 400 lines: no docstring, first thing.\nimport os\n", True),
        ('"""Doc."""\n\nimport os\n', False),
    ],
)
def test_the_reason_is_read_only_right_after_the_docstring(source: str, says: bool) -> None:
    assert says_why_it_is_long(source) is says


def test_a_long_function_is_found_and_a_short_one_is_not() -> None:
    body = [f"x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1)]  # with its def: 60 lines
    fits = "\n".join(["def fits():", *(f"    {line}" for line in body)])
    method = "\n".join(["    async def too_long(self):", *(f"        {x}" for x in body)])
    source = f"{fits}\n\n\nclass C:\n{method}\n        return 0\n"
    assert long_functions(source, "probe.py") == ["probe.py:64 too_long (61 lines)"]
