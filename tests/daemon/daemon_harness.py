"""The daemon test harness: real daemon processes on emulated GPUs (the ``daemons`` fixture in
``conftest.py`` starts and cleans them up), and the helpers the tests import.

A module of its own rather than ``conftest``: test modules import these by name, and a module
named ``conftest`` is ambiguous when pytest runs this directory with another that has one
(``pytest tests/daemon tests/share``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collocate.client.connect import Client

HERE = Path(__file__).parent
JOB = str(HERE / "job.py")
START_TIMEOUT_S = 60.0  # a bound on failure only: `serve --mlflow` imports MLflow, over 30 s on a loaded 2-core box


def job_argv(mem_mib: float, seconds: float, peak_mib: float | None = None, sm: float = 0.1,
             *extra: str) -> list[str]:
    """An emulated job: holds ``mem_mib`` (then ``peak_mib`` from 30 % progress) for ``seconds``;
    ``extra``: ``--startup S``, ``--warmup W``, ``--dram D``, ``--steps-per-s N`` (steps it
    reports), or arguments that only name it."""
    return [sys.executable, JOB, str(mem_mib), str(seconds),
            "-" if peak_mib is None else str(peak_mib), str(sm), *extra]


def gated_argv(gate: Path, exit_with: str = "") -> list[str]:
    """A job that runs until ``gate`` exists, then exits (with ``sys.exit(exit_with)`` when
    given): certainly still running until the test says otherwise, however loaded the machine,
    where a job of a fixed length may end before a slow restart saw it run."""
    code = ("import pathlib, sys, time\n"
            "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
            "sys.exit(sys.argv[2] or None)")
    return [sys.executable, "-c", code, str(gate), exit_with]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class Daemon:
    def __init__(self, state_dir: Path, args: list[str]) -> None:
        self.state_dir = state_dir
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.client = Client(state_dir, timeout_s=30)

    def start(self) -> Daemon:
        cmd = [sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(self.state_dir),
               *self.args]
        self.log = open(self.state_dir.parent / f"{self.state_dir.name}.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._ready, START_TIMEOUT_S, "the daemon to answer")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}: {self.read_log()}")
        try:
            self.client.request("ping")
            return True
        except Exception:
            return False

    def read_log(self) -> str:
        return (self.state_dir.parent / f"{self.state_dir.name}.log").read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=15)

    def submit(self, argv: list[str], **opts: Any) -> str:
        opts.setdefault("cwd", str(self.state_dir.parent))
        return self.client.request("submit", argv=argv, base_env=dict(os.environ), **opts)["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.client.request("show", id=job_id)

    def wait_state(self, job_id: str, states: tuple[str, ...] | str, timeout: float = 30.0) -> dict:
        states = (states,) if isinstance(states, str) else states
        return wait_for(lambda: (d := self.job(job_id))["state"] in states and d,
                        timeout, f"job {job_id} to be {states}")

    def producer_pids(self) -> list[int]:
        """Shared-dataset producers still serving or starting (they outlive a killed daemon, like
        jobs): those that answer a probe, and those the daemon's pid records name."""
        from collocate.node.launcher import process_matches
        from collocate.share.lifecycle import probe

        share = self.state_dir / "share"
        found = (probe(log.stem, share) for log in share.glob("*.log"))
        pids = {status.pid for status in found if status is not None}
        for record in share.glob("*.pid"):
            try:
                r = json.loads(record.read_text())
            except (OSError, ValueError):
                continue
            if process_matches(r.get("pid"), r.get("started")):
                pids.add(int(r["pid"]))
        return sorted(pids)

    def remove_cgroups(self) -> None:
        """The (empty) cgroups this daemon and its nodes' agents made, which a SIGKILLed daemon
        leaves; wait a while for jobs just killed, or launched as it was killed, to leave theirs."""
        from collocate.node.cgroups import Cgroups

        deadline = time.monotonic() + 15
        for key in [str(self.state_dir), *(str(p) for p in self.state_dir.glob("nodes/*"))]:
            for state in Path(Cgroups.detect(key).parents.get("freezer", "/nonexistent")).glob("*/freezer.state"):
                state.write_text("THAWED")  # a job left frozen (suspended) dies only once thawed
            while not Cgroups.remove_leftovers(key) and time.monotonic() < deadline:
                time.sleep(0.1)

    def kill_all(self) -> None:
        """Kill the daemon and everything it started (runners and producers outlive a killed
        daemon, as they should in use), and remove the cgroups its jobs left."""
        self.kill()
        for pid in [*self.runner_pids(), *self.producer_pids()]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.remove_cgroups()

    def runner_pids(self) -> list[int]:
        pids = []
        for record in self.state_dir.glob("jobs/*/attempt-*/runner.json"):
            try:
                pids.append(int(json.loads(record.read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                pass
        return pids

