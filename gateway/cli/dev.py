"""`draftgate dev`: tools for developing against real vLLM on a laptop or in CI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.common import extra_required

dev_app = typer.Typer(
    help="Developer tools: tiny local models for real vLLM servers, generated reference docs."
)


@dev_app.command("tiny-models")
def tiny_models(
    directory: Annotated[Path, typer.Argument(help="Where to write the model directories.")],
    seed: Annotated[int, typer.Option(help="Seed of every random weight.")] = 0,
) -> None:
    """Build a tiny Llama target with a local tokenizer and random drafters (no hub)."""
    with extra_required("tiny-models"):
        from backends.tiny_models import build_tiny_models

    models = build_tiny_models(directory, seed)
    for name, path in vars(models).items():
        typer.echo(f"{name:<20}{path}")


@dev_app.command("docs")
def docs(
    context: typer.Context,
    directory: Annotated[
        Path, typer.Argument(help="Where to write the generated reference pages.")
    ] = Path("docs"),
) -> None:
    """Regenerate the reference pages: settings, the admin API and the CLI (docs/*.md)."""
    from gateway.cli.docs import write_docs

    for path in write_docs(directory, context.find_root().command):
        typer.echo(path)
