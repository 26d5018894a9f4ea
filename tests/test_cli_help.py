"""Every command's ``--help`` in an 80-column terminal: nothing wider, and the description's
lines broken where the terminal needs it, not where the source's docstring happened to wrap
(``collocate.common.cli_help``; issue 37)."""

from __future__ import annotations

import click
import pytest
from typer.testing import CliRunner

from collocate.cli import COMMANDS, app, load
from collocate.common.cli_help import reflow

WIDTH = 80


def _commands() -> list[tuple[str, ...]]:
    found = []

    def walk(path: tuple[str, ...], command: click.Command) -> None:
        found.append(path)
        if isinstance(command, click.Group):
            for name in command.list_commands(click.Context(command)):
                walk((*path, name), command.get_command(click.Context(command), name))

    for name in COMMANDS:
        walk((name,), load(name))
    return found


def _command(path: tuple[str, ...]) -> click.Command:
    command = load(path[0])
    for name in path[1:]:
        command = command.get_command(click.Context(command), name)
    return command


@pytest.mark.parametrize("path", _commands(), ids=" ".join)
def test_help_reflows_to_the_terminal(path):
    command = _command(path)
    rest = (command.help or "").split("\n\n", 1)[1:]  # Typer joins the first paragraph's lines itself
    assert [reflow(text) for text in rest] == rest, (
        f"{' '.join(path)}: register it with help=help_text(fn) (collocate.common.cli_help), or put "
        "each paragraph of its docstring on one line")
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, out.output
    description = lines[next(i for i, line in enumerate(lines) if "Usage:" in line) + 1:]
    description = [line.strip() for line in description[:next(
        (i for i, line in enumerate(description) if line.startswith(("╭", "Options", "Arguments"))), None)]]
    for line, following in zip(description, description[1:], strict=False):
        if line and following and not following.startswith("collocate "):
            # a line is broken early only when the next word would not have fitted beside it
            assert len(line) + 1 + len(following.split()[0]) > WIDTH - 4, f"{line!r} then {following!r}"
