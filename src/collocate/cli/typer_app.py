"""The ``collocate`` Typer app: the root group, which loads a command's module only when that
command runs (its rows are ``collocate.cli.COMMANDS``). Typer reads every command line the fast
path (``cli_fast``) leaves to it: ``-h`` of a command, completion, mistakes, the rare options."""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from collocate.cli import COMMANDS, ROOT_HELP, VERSION_HELP
from collocate.common.cli_params import adopt


def load(name: str) -> Any:
    """The click command ``name``, built from its module's ``register`` (None if unknown)."""
    entry = COMMANDS.get(name)
    if entry is None:
        return None
    found = typer.Typer(add_completion=False)
    importlib.import_module(entry.module).register(found)
    adopt(found)
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    one.registered_commands = [c for c in found.registered_commands if c.name == name]
    groups = [g for g in found.registered_groups if g.name == name]
    if not one.registered_commands and not groups:
        raise LookupError(f"{entry.module} registers no command {name!r}")
    if one.registered_commands:
        command = typer.main.get_command(one)  # one command alone: that command itself
    else:
        one.registered_groups = groups
        group = typer.main.get_group(one).get_command(None, name)  # type: ignore[arg-type]  # Group reads no ctx
        if group is None:  # cannot be: groups holds a group of that name
            raise LookupError(f"{entry.module} registers no command {name!r}")
        command = group
    if entry.hidden:
        command.hidden = True
    return command


class LazyGroup(TyperGroup):
    """The root: its commands come from ``COMMANDS`` when asked for, one at a time."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return load(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # click's plain layout: Typer's rich one would import every command for its line
        super(TyperGroup, self).format_help(ctx, formatter)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, entry.help) for name, entry in COMMANDS.items() if not entry.hidden]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _version(value: bool) -> None:
    if value:
        from collocate import __version__

        typer.echo(f"collocate {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="collocate",
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=True,  # --install-completion, --show-completion
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
)


@app.callback(help=ROOT_HELP)
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                       help=VERSION_HELP)] = False,
) -> None:
    """The root's own options; its help is ``collocate.cli.ROOT_HELP``."""
