"""``collocate serve`` as a child process: how the demo and the benchmark mini-trace run a daemon.

It runs in its own session, so a Ctrl-C meant for the parent reaches it only through ``stop``,
which asks politely (SIGTERM) and then kills the whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from collocate.client.connect import Client
from collocate.common.errors import CollocateError


class DaemonProcess:
    def __init__(self, state_dir: Path, serve_args: list[str], log_path: Path, *,
                 python: str = sys.executable, name: str = "the daemon",
                 client_timeout_s: float = 60.0) -> None:
        self.state_dir, self.log_path, self.name = state_dir, log_path, name
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [python, "-m", "collocate.daemon", "serve", "--state-dir", str(state_dir), *serve_args],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.client = Client(state_dir, timeout_s=client_timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the daemon answers a ping; fail early if it exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CollocateError(f"{self.name} exited with status {self.proc.returncode} before answering",
                                     hint=f"see {self.log_path}")
            try:
                self.client.request("ping")
                return
            except CollocateError:
                time.sleep(0.2)
        raise CollocateError(f"{self.name} did not answer within {timeout_s:g} s", hint=f"see {self.log_path}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL to its process group; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode
