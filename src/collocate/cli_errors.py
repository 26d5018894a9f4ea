"""How every command-line entry point turns a ``CollocateError`` into a message and exit 2."""

from __future__ import annotations

import sys

import typer

from collocate.errors import CollocateError


def run(app: typer.Typer) -> None:
    """Run a Typer app; a user error prints its message and hint (no traceback) and exits 2."""
    try:
        app()
    except CollocateError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)
