"""The committed reference pages under docs/ are current, and say what the code says."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from backends.methods import make_spec, render_vllm_command
from dashboard.settings import DashboardSettings
from gateway.cli.docs import PAGES, cli_commands, openapi_document, operations, settings_table
from gateway.cli.main import app
from gateway.services.fleet import Fleet
from gateway.settings import Settings

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"


def test_generated_pages_are_current(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dev", "docs", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in PAGES:
        fresh = (tmp_path / name).read_text()
        committed = (DOCS / name).read_text()
        assert committed == fresh, f"docs/{name} is stale: run `make docs` and commit"


@pytest.mark.parametrize("settings", [Settings, DashboardSettings])
def test_settings_page_has_a_row_per_field_with_its_description(settings: type) -> None:
    page = (DOCS / "settings.md").read_text()
    rows = settings_table(settings)[2:]
    assert len(rows) == len(settings.model_fields)
    for name, field in settings.model_fields.items():
        assert f"`DRAFTGATE_{name.upper()}`" in page
        assert field.description, f"{name} has no description"
    for row in rows:
        assert row in page


def test_admin_page_names_every_admin_route() -> None:
    page = (DOCS / "admin-api.md").read_text()
    routes = list(operations(openapi_document()))
    assert len(routes) >= 30  # backends, models, prices, keys, audit, plan, savings, ...
    for method, path, _ in routes:
        assert f"#### `{method} {path}`" in page
        assert f"| {method} | `{path}` |" in page


def _yaml_blocks(text: str) -> list[str]:
    blocks, inside, current = [], False, []
    for line in text.splitlines():
        if line.strip() == "```yaml":
            inside, current = True, []
        elif inside and line.strip() == "```":
            inside = False
            blocks.append("\n".join(current))
        elif inside:
            current.append(line)
    return blocks


def test_every_fleet_example_in_the_docs_is_a_valid_fleet_file() -> None:
    fleets = []
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for block in _yaml_blocks(path.read_text()):
            document = yaml.safe_load(block)
            if isinstance(document, dict) and set(document) & set(Fleet.model_fields):
                fleets.append(Fleet.model_validate(document))
    assert len(fleets) >= 2
    assert any(f.backends and f.models and f.prices for f in fleets)
    assert any(f.pools for f in fleets)


def test_fleet_reference_names_every_key() -> None:
    page = (DOCS / "fleet.md").read_text()
    fleet_fields = Fleet.model_fields
    nested = [
        fleet_fields[name].annotation.__args__[0]  # type: ignore[union-attr]
        for name in ("backends", "models", "prices", "pools")
    ]
    keys = set(fleet_fields)
    for model in nested:
        keys |= set(model.model_fields)
    keys |= set(nested[1].model_fields["policy"].annotation.model_fields)
    for source in nested[3].model_fields["discovery"].annotation.__args__:  # DNS, Kubernetes
        keys |= set(source.model_fields)
    missing = sorted(k for k in keys if f"`{k}`" not in page)
    assert not missing, f"docs/fleet.md does not describe {missing}"


def test_vllm_serve_commands_in_the_docs_are_what_the_catalog_renders() -> None:
    page = (DOCS / "real-vllm.md").read_text()
    rows = re.findall(r"^\| `([\w-]+)` \| `(vllm serve [^`]+)` \|$", page, re.MULTILINE)
    assert [method for method, _ in rows] == ["plain", "eagle3", "p-eagle", "dflash", "dspark"]
    for method, command in rows:
        argv = shlex.split(command)
        config = {}
        if "--speculative-config" in argv:
            config = json.loads(argv[argv.index("--speculative-config") + 1])
        spec = make_spec(method, config.get("num_speculative_tokens"), config.get("model"))
        rendered = render_vllm_command(argv[2], spec, host="0.0.0.0", port=8000)  # noqa: S104
        assert command == rendered


def _shell_commands(text: str) -> list[list[str]]:
    """`draftgate ...` command lines of the ```sh blocks (continued lines joined)."""
    commands, inside, pending = [], False, ""
    for line in text.splitlines():
        if line.strip() in ("```sh", "```"):
            inside = line.strip() == "```sh"
            continue
        if not inside:
            continue
        pending += line.rstrip().removesuffix("\\")
        if line.rstrip().endswith("\\"):
            continue
        try:
            argv, pending = shlex.split(pending, comments=True), ""
        except ValueError:  # a quoted string goes on on the next line
            pending += " "
            continue
        if "draftgate" in argv:  # the last one: `kubectl -n draftgate exec ... -- draftgate ...`
            start = len(argv) - argv[::-1].index("draftgate")
            commands.append(argv[start:])
    return commands


def test_every_draftgate_command_in_the_docs_parses_with_the_real_cli() -> None:
    root = typer.main.get_command(app)
    commands = []
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        commands += _shell_commands(path.read_text())
    assert len(commands) >= 5
    for argv in commands:
        command, rest = root, list(argv)
        # Typer's command classes are its own (not click's), so groups are told by `commands`.
        while hasattr(command, "commands") and rest and rest[0] in command.commands:
            command = command.commands[rest.pop(0)]
        assert not hasattr(command, "commands"), f"draftgate {shlex.join(argv)}: no such command"
        command.make_context(command.name or "draftgate", rest)  # raises on a bad flag


def test_cli_page_has_every_command_and_option() -> None:
    page = (DOCS / "cli.md").read_text()
    commands = list(cli_commands(typer.main.get_command(app), ("draftgate",)))[1:]
    assert len(commands) >= 15
    for path, command in commands:
        assert f"## `{' '.join(path)}`" in page
        for option in (o for p in command.params for o in p.opts if o.startswith("--")):
            assert f"`{option}" in page or f"/ {option}" in page or f" {option} " in page
