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

Importing Typer is most of a short command's time, so this module does not: ``main`` first
asks ``cli_fast`` (the root's ``--help`` and ``--version``, and the usual command lines of
``submit``, ``ls``, ``show``, ``gpus``, ``logs``, ``cancel``, ``wait``), and only what it leaves goes to the Typer app in
``cli_app`` (``collocate.cli.app`` still names it). The client's options are declared with
``cli_params.Option`` (not ``typer.Option``) so that both can read them.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple


class Command(NamedTuple):
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
    "dashboard": Command("collocate.cli.monitor", "Serve your own web dashboard of a running daemon."),
    "report": Command("collocate.cli.monitor", "Summarise GPU usage per user, job and GPU, with plots."),
    "estimate": Command("collocate.estimate.cli", "Estimate a training job's peak GPU memory (no GPU needed)."),
    "serve": Command("collocate.daemon.cli", "Run the daemon in the foreground."),
    "demo": Command("collocate.daemon.cli", "Run the daemon on 4 emulated A100s and compare policies."),
    "simulate": Command("collocate.sim.cli", "Replay a job trace under placement policies and compare them."),
    "bench": Command("collocate.bench.cli", "Measure collocated training on a real GPU (or rehearse on CPU)."),
    "share": Command("collocate.share.cli", "Shared data loading: one input pipeline, many training jobs."),
    "emulate-job": Command("collocate.node.cli", "Pretend to train on emulated GPUs (the daemon's "
                           "emulated jobs).", hidden=True),
}


#: The root's help text (``collocate --help``) as Click prints it (no indentation to clean),
#: and its --version option's line.
ROOT_HELP = ("Share GPUs between training jobs safely and fast.\n\n"
             "`collocate COMMAND -h` explains a command; docs/daemon.md the daemon and its client.")
VERSION_HELP = "Print collocate's version and exit."


def main() -> None:
    """``collocate``: the fast path answers what it knows (``cli_fast``); Typer the rest."""
    from collocate.cli.fast import answer

    answer(sys.argv[1:])  # exits when it has answered
    from collocate.cli.typer_app import app
    from collocate.common.cli_errors import run

    run(app, commands=COMMANDS)


def __getattr__(name: str) -> Any:
    """``collocate.cli.app`` (and ``load``): the Typer app, built only when asked for."""
    if name in ("app", "load", "LazyGroup"):
        from collocate.cli import typer_app as cli_app

        return getattr(cli_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

