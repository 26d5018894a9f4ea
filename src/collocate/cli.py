"""The `collocate` command line.

Each area owns its commands in its own module and adds them to a Typer app through
``register(app)``. This file only lists them, in ``COMMANDS``: a command's module is imported
when that command runs (or its ``--help`` or completion is asked), never to print the root
``--help``, which is written from the table. So ``collocate ls`` imports the client and nothing of
the estimator, the simulator, the dashboard or the daemon's loop (``tests/test_cli_root.py``
checks which modules each command imports; ``benchmarks/client_speed.py`` times them).

**Adding a command**: define it and add it in its area's ``register`` as before, then add one
row here: ``"NAME": Command("its.module", "One line for --help.")`` (``hidden=True`` for a
command that is not for users). ``tests/test_cli_root.py`` fails while a registered command has
no row, or a row names a command its module does not register.

The root also answers ``--version``/``-V``, ``-h`` (as ``--help``, on every command), and
``--install-completion``/``--show-completion`` (Typer's shell completion for bash, zsh, fish and
PowerShell; completing a command's options imports only that command's module).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from collocate.cli_errors import run


@dataclass(frozen=True, slots=True)
class Command:
    module: str  # the module whose ``register(app)`` adds the command
    help: str  # its line in ``collocate --help``
    hidden: bool = False  # runnable, not listed (internal commands)


#: Every command, in the order ``collocate --help`` lists them: what members type first.
COMMANDS: dict[str, Command] = {
    "submit": Command("collocate.client.cli", "Queue a job and print its id."),
    "run": Command("collocate.client.cli", "Run a command interactively on a GPU, through the "
                   "queue (srun --pty)."),
    "ls": Command("collocate.client.cli", "List jobs, with why each pending one waits."),
    "show": Command("collocate.client.cli", "Show one job: command, memory, why it waits, attempts."),
    "logs": Command("collocate.client.cli", "Print a job's output (-f follows it to the end)."),
    "cancel": Command("collocate.client.cli", "Cancel jobs (running ones get SIGTERM, then SIGKILL)."),
    "purge": Command("collocate.client.purge", "Remove ended jobs' stored logs, freeing your storage quota."),
    "wait": Command("collocate.client.cli", "Wait until jobs end; exit 0 if all ended done."),
    "gpus": Command("collocate.client.cli", "GPUs as the daemon sees them: memory, room, activity, jobs."),
    "hold": Command("collocate.client.cli", "Keep pending jobs from starting until released."),
    "release": Command("collocate.client.cli", "Let held jobs start again."),
    "priority": Command("collocate.client.cli", "Change the priority of pending jobs."),
    "update": Command("collocate.client.cli", "Change a pending job's memory, time limit, name, "
                      "dependencies or priority (scontrol update)."),
    "limits": Command("collocate.client.cli", "Show the per-user caps and fair share, or set them."),
    "drain": Command("collocate.client.cli", "Stop placing jobs; running ones finish."),
    "suspend": Command("collocate.client.cli", "Freeze running jobs until resumed (scontrol suspend)."),
    "resume": Command("collocate.client.cli", "Thaw suspended jobs (resume ID...), or place jobs again "
                      "after `collocate drain` (no ids)."),
    "dashboard-url": Command("collocate.client.cli", "Print the daemon's dashboard URL with its token."),
    "dashboard": Command("collocate.monitor.cli", "Serve your own web dashboard of a running daemon."),
    "report": Command("collocate.monitor.cli", "Summarise GPU usage per user, job and GPU, with plots."),
    "estimate": Command("collocate.estimate.cli", "Estimate a training job's peak GPU memory (no GPU needed)."),
    "serve": Command("collocate.daemon.cli", "Run the daemon in the foreground."),
    "demo": Command("collocate.daemon.cli", "Run the daemon on 4 emulated A100s and compare policies."),
    "simulate": Command("collocate.sim.cli", "Replay a job trace under placement policies and compare them."),
    "bench": Command("collocate.bench.cli", "Measure collocated training on a real GPU (or rehearse on CPU)."),
    "share": Command("collocate.share.cli", "Shared data loading: one input pipeline, many training jobs."),
    "emulate-job": Command("collocate.gpus.cli", "Pretend to train on emulated GPUs (the daemon's "
                           "emulated jobs).", hidden=True),
}


def load(name: str) -> Any:
    """The click command ``name``, built from its module's ``register`` (None if unknown)."""
    entry = COMMANDS.get(name)
    if entry is None:
        return None
    found = typer.Typer(add_completion=False)
    importlib.import_module(entry.module).register(found)
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


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                       help="Print collocate's version and exit.")] = False,
) -> None:
    """Share GPUs between training jobs safely and fast.

    `collocate COMMAND -h` explains a command; docs/daemon.md the daemon and its client.
    """


def main() -> None:
    run(app, commands=COMMANDS)


if __name__ == "__main__":
    main()
