"""``python -m collocate.share serve ...``: how the daemon launches producers (see ``lifecycle``)."""

from __future__ import annotations

import sys

import typer

from collocate.common.errors import CollocateError
from collocate.share.cli import share_app


def main() -> None:
    try:
        share_app()
    except CollocateError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
