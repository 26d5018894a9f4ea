"""``python -m collocate.daemon``: the daemon's commands alone (serve, submit, ls, ...).

The same commands as ``collocate``, without importing every other area's CLI: faster to start
(the tests start many daemons) and unaffected by the other command modules.
"""

from __future__ import annotations

import typer

from collocate.client.cli import register as register_client
from collocate.client.purge import register as register_purge
from collocate.common.cli_errors import run
from collocate.common.cli_params import adopt
from collocate.daemon.cli import register

app = typer.Typer(name="collocate-daemon", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
register(app)
register_client(app)
register_purge(app)
adopt(app)  # the shared options are declared without Typer (cli_params)


def main() -> None:
    run(app)


if __name__ == "__main__":
    main()
