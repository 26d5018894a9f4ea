"""``python -m collocate.daemon``: the daemon's commands alone (serve, submit, ls, ...).

The same commands as ``collocate``, without importing every other area's CLI: faster to start
(the tests start many daemons) and unaffected by the other command modules.
"""

from __future__ import annotations

import sys

import typer

from collocate.daemon.cli import register
from collocate.errors import CollocateError

app = typer.Typer(name="collocate-daemon", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
register(app)


def main() -> None:
    try:
        app()
    except CollocateError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
