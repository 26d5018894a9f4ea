"""The root command line (``collocate.cli``): every command has its row in the lazy table, the
client's commands import only what they need (never numpy, fastapi, torch: what made
``collocate ls`` take half a second), ``--version``, ``-h`` and shell completion answer, and
internal commands stay out of ``--help``. Import-based, not timed: the times are
``benchmarks/client_speed.py``'s."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from collocate import __version__
from collocate.cli import COMMANDS

HEAVY = ("numpy", "fastapi", "torch", "starlette", "uvicorn", "matplotlib", "pandas", "psutil")
#: What each client command may import beyond the standard library and typer: nothing; tables
#: that fit are written without Rich (``client/textout.py``), which wraps only what must wrap.
CLIENT = {"--help": (), "ls": (), "show": (), "gpus": (), "submit": (), "cancel": (), "wait": (),
          "logs": (), "run": ()}


def _collocate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collocate.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, check=False)


def test_every_registered_command_has_its_row_and_every_row_its_command():
    for module in {c.module for c in COMMANDS.values()}:
        app = typer.Typer()
        importlib.import_module(module).register(app)
        registered = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
        listed = {name for name, c in COMMANDS.items() if c.module == module}
        assert registered == listed, (f"{module}: add a row to collocate.cli.COMMANDS for "
                                      f"{sorted(registered - listed)}; drop {sorted(listed - registered)}")


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["show", "1"], ["gpus"], ["submit", "--", "true"],
                                  ["cancel", "1"], ["wait", "1"], ["logs", "1"],
                                  ["run", "--", "true"]])
def test_client_commands_import_only_what_they_need(tmp_path: Path, args: list[str]):
    """Run as users run it (against no daemon: it fails to connect, after every import)."""
    probe = ("import sys, atexit, json\n"
             "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=open(sys.argv.pop(1), 'w')))\n"
             "from collocate.cli import main\n"
             "sys.argv[0] = 'collocate'\n"
             "main()\n")
    out = tmp_path / "modules.json"
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(tmp_path / "no-daemon")}
    env.pop("COLLOCATE_HOST", None)
    done = subprocess.run([sys.executable, "-c", probe, str(out), *args], capture_output=True,
                          text=True, timeout=120, env=env, check=False, stdin=subprocess.DEVNULL)
    modules = {m.split(".")[0] for m in json.loads(out.read_text())}
    allowed = CLIENT[args[0]]
    heavy = sorted(m for m in modules if m in HEAVY + ("rich",) and m not in allowed)
    assert not heavy, f"collocate {' '.join(args)} imports {heavy} ({done.stderr[-300:]})"
    others = sorted(m for m in json.loads(out.read_text()) if m.startswith(("collocate.estimate.",
                    "collocate.sim", "collocate.monitor", "collocate.web", "collocate.bench",
                    "collocate.core.scheduler", "collocate.core.policies", "collocate.core.model"))
              and m != "collocate.estimate.base")
    assert not others, f"collocate {' '.join(args)} imports {others}"


def test_version_short_help_and_hidden_commands():
    assert _collocate("--version").stdout.strip() == f"collocate {__version__}"
    assert _collocate("-V").stdout.strip() == f"collocate {__version__}"
    root = _collocate("-h")
    assert root.returncode == 0 and "submit" in root.stdout and "run" in root.stdout
    assert "emulate-job" not in root.stdout  # internal: the daemon's emulated jobs run it
    assert root.stdout.index("submit") < root.stdout.index("estimate")  # members' commands first
    assert "--install-completion" in root.stdout
    sub = _collocate("ls", "-h")
    assert sub.returncode == 0 and "--state" in sub.stdout
    assert _collocate("emulate-job", "-h").returncode == 0  # hidden, still there


def test_shell_completion_completes_commands_and_options_and_not_hidden_ones():
    def complete(words: str, cword: int) -> list[str]:
        env = {**os.environ, "_COLLOCATE_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(cword)}
        return _collocate(env=env).stdout.split()

    assert "submit" in complete("collocate su", 1)
    assert complete("collocate emu", 1) == []
    assert "--state-dir" in complete("collocate ls --st", 2)
    # Typer finds the shell among the command's ancestors (not $SHELL): the nearest one is
    # whatever ran the tests (make's /bin/sh on CI, which it does not support) unless a user's
    # bash runs it, as here; "; exit" keeps bash from exec'ing the command in its own place.
    script = subprocess.run(["bash", "-c", '"$0" -m collocate.cli --show-completion; exit', sys.executable],
                            capture_output=True, text=True, timeout=120, check=False)
    assert "complete" in script.stdout and "_COLLOCATE" in script.stdout, script.stderr
