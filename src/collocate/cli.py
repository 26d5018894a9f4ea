"""The `collocate` command line.

Each area owns its commands in its own module and adds them to the app through ``register``;
this file only assembles them and turns ``CollocateError`` into a clean message and exit code.
Heavy imports (torch, matplotlib) happen inside commands, so ``collocate --help`` stays fast.
"""

from __future__ import annotations

import importlib

import typer

from collocate.cli_errors import run

app = typer.Typer(
    name="collocate",
    help="Share GPUs between training jobs safely and fast.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Share GPUs between training jobs safely and fast."""


# Modules that add commands to the app; each defines ``register(app: typer.Typer) -> None``.
COMMAND_MODULES = (
    "collocate.sim.cli",
    "collocate.share.cli",
    "collocate.gpus.cli",
    "collocate.estimate.cli",
    "collocate.daemon.cli",
    "collocate.client.cli",
    "collocate.monitor.cli",
    "collocate.bench.cli",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    run(app)


if __name__ == "__main__":
    main()
