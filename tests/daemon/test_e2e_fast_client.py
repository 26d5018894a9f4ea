"""The fast path against a real daemon: ``collocate ls``, ``show``, ``gpus``, ``submit``, ``logs``,
``wait`` and ``cancel`` print the same, and exit the same, as Typer's path does for the same
command line, without importing Typer (``collocate.cli.fast``; its parsing is held to Typer's in ``tests/test_cli_fast.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: ``collocate`` as members run it, reporting whether Typer was imported (into the file argv[1])
FAST = ("import sys, atexit\n"
        "out = sys.argv.pop(1)\n"
        "atexit.register(lambda: open(out, 'w').write(str('typer' in sys.modules)))\n"
        "sys.argv[0] = 'collocate'\n"
        "from collocate.cli import main\n"
        "main()\n")
#: the same command line through Typer alone
TYPER = ("import sys\n"
         "from collocate.cli import COMMANDS\n"
         "from collocate.cli.typer_app import app\n"
         "from collocate.common.cli_errors import run\n"
         "run(app, commands=COMMANDS)\n")


def _both(tmp_path: Path, state: Path, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COLLOCATE_")},
           "COLLOCATE_STATE_DIR": str(state), "COLUMNS": "100"}
    flag = tmp_path / "typer-imported"

    def go(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", *argv, *args], capture_output=True, text=True, env=env,
                              timeout=60, check=False, cwd=tmp_path, stdin=subprocess.DEVNULL)

    fast = go(FAST, str(flag))
    typer = go(TYPER)
    assert flag.read_text() == str(fast.returncode == 2), (args, "the fast path imported Typer", fast.stderr)
    return fast, typer


def _still(out: str) -> object:
    """``out``, JSON parsed and without the durations that grow between the two runs
    (``wait_s``, ``elapsed_s``); a table as it is (it shows minutes)."""
    def drop(v: object) -> object:
        if isinstance(v, dict):
            return {k: drop(x) for k, x in v.items() if not k.endswith("_s")}
        return [drop(x) for x in v] if isinstance(v, list) else v
    try:
        return drop(json.loads(out))
    except ValueError:
        return out


def test_hot_commands_print_and_exit_as_through_typer(daemons, tmp_path: Path):
    d = daemons()
    job = d.submit(["true"], mem="1GiB", hold=True, name="held")
    for args in (["ls"], ["ls", "--format", "json"], ["ls", "-a", "--state", "pending", "-n", "he*"],
                 ["show", job], ["show", job, "--format=json"], ["gpus"],
                 ["gpus", "--format", "json"], ["show", "999"], ["ls", "--format", "xml"],
                 ["submit", "--mem", "2", "--", "true"], ["logs", job], ["logs", job, "--format", "json"],
                 ["wait", "--timeout", "0", job], ["cancel", "999"]):
        fast, typer = _both(tmp_path, d.state_dir, *args)
        assert (fast.returncode, _still(fast.stdout), fast.stderr) == (typer.returncode, _still(typer.stdout),
                                                                       typer.stderr), args
        wanted = {"show 999": 2, "ls --format xml": 2, "submit --mem 2 -- true": 2, f"wait --timeout 0 {job}": 124,
                  "cancel 999": 1}.get(" ".join(args), 0)
        assert fast.returncode == wanted, (args, fast.stderr)


def test_submit_queues_the_same_job_both_ways(daemons, tmp_path: Path):
    d = daemons()
    args = ["submit", "--mem", "1GiB", "--hold", "--name", "n", "--env", "A=1", "--after-any", "1",
            "-t", "5", "--format", "json", "--", "python", "-c", "pass"]
    d.submit(["true"], mem="1GiB", hold=True)
    fast, typer = _both(tmp_path, d.state_dir, *args)
    assert fast.returncode == typer.returncode == 0, (fast.stderr, typer.stderr)
    shown = []
    for out in (fast, typer):
        job = d.job(json.loads(out.stdout)["id"])
        shown.append({k: v for k, v in job.items() if k not in ("id", "submitted", "key", "reason", "attempts")
                      and "time" not in k})
    assert shown[0] == shown[1]
