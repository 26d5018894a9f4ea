"""``collocate run``: an interactive job through the queue, driven as a member types it, in a
real pseudo-terminal (``pty.fork``), against a real daemon on emulated GPUs: what is typed
reaches the job and its output comes back, Ctrl-C interrupts the job's foreground command and
not the shell, the window size is the member's, the exit status passes through, and the job
ends when the client goes. Also over ``--host`` (TCP, TLS, a token), and refused to another
member (``test_lab_run.py``-style checks live in ``tests/lab``)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import wait_for
from lab_harness import lab_daemon, lab_members, member_python, stop_lab, why_no_lab, work_dir
from test_e2e_remote import _remote

from collocate.common.errors import CollocateError

CLI = [sys.executable, "-m", "collocate.daemon"]


class Terminal:
    """``collocate run ...`` on a pty of its own: what a member's terminal sees."""

    def __init__(self, args: list[str], env: dict[str, str], rows: int = 31, cols: int = 97,
                 member: Any = None) -> None:
        python = member_python()[0] if member is not None else CLI[0]
        pid, fd = pty.fork()
        if pid == 0:  # the child: the client, on the pty's slave side
            try:
                if member is not None:  # as a lab member logged in on this terminal
                    os.setgroups(list(member.groups))
                    os.setgid(member.gid)
                    os.setuid(member.uid)
                    os.chdir("/tmp")
                os.execve(python, [python, *CLI[1:], *args], env)
            finally:
                os._exit(127)
        self.pid, self.fd, self.seen = pid, fd, b""
        self.resize(rows, cols)

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.kill(self.pid, signal.SIGWINCH)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} not seen in {timeout} s; the terminal shows:\n"
                                     f"{self.seen.decode(errors='replace')}")
            if select.select([self.fd], [], [], min(left, 0.2))[0]:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:  # EIO: the client has exited
                    time.sleep(0.05)
        return self.seen.decode(errors="replace")

    def status(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.1)[0]:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        raise AssertionError(f"collocate run did not exit; the terminal shows:\n{self.seen.decode(errors='replace')}")


def _env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLOCATE_")}
    env.update({"COLLOCATE_STATE_DIR": str(state_dir), "TERM": "xterm", "PS1": "$ "})
    return env


def test_a_shell_through_the_queue_is_the_members_terminal(daemons, tmp_path: Path):
    d = daemons(gpus="emulated:1xA100-40GB")
    blocker = d.submit([sys.executable, "-c", "import time; time.sleep(60)"], mem="39GiB")
    d.wait_state(blocker, "running")
    term = Terminal(["run", "--mem", "1GiB", "--cwd", str(tmp_path), "--", "sh", "-i"], _env(d.state_dir))
    shown = term.expect("waits, position 1")  # the live line while the GPU is full
    assert "job 2" in shown
    d.client.request("cancel", id=blocker)
    term.expect("$ ")  # the shell's prompt: the job runs and this terminal is its
    term.type("echo typed$((40+2))\n")
    term.expect("typed42")
    term.type("stty size\n")
    term.expect("31 97")
    term.resize(44, 120)  # relayed to the job's terminal by the client and the daemon: asked until it shows
    deadline = time.monotonic() + 30.0
    while "44 120" not in term.seen.decode(errors="replace"):
        term.type("stty size\n")
        try:
            term.expect("44 120", timeout=1.0)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    term.type("sleep 30; echo slept\n")
    time.sleep(1.0)
    term.type("\x03")  # Ctrl-C: SIGINT for the sleep, the shell stays
    term.type("echo after$((1+1))\n")
    term.expect("after2")
    assert "\nslept" not in term.seen.decode(errors="replace")  # (its echo has " slept")
    term.type("exit 7\n")
    assert term.status() == 7
    job = d.wait_state("2", ("failed",))
    assert len(job["attempts"]) == 1  # ended with its status, never requeued
    assert "typed42" in str(d.client.request("logs", id="2"))  # its output is in its log too


def test_the_job_ends_when_its_client_goes(daemons, tmp_path: Path):
    d = daemons(gpus="emulated:1xA100-40GB")
    term = Terminal(["run", "--mem", "1GiB", "--cwd", str(tmp_path), "--", "sh", "-i"], _env(d.state_dir))
    term.expect("$ ")
    term.type("sleep 300\n")
    time.sleep(0.5)
    os.kill(term.pid, signal.SIGKILL)  # the member's terminal is gone, without a word
    term.status()
    job = d.wait_state("1", ("failed", "cancelled", "done"), timeout=30)
    assert len(job["attempts"]) == 1


def test_a_queued_run_is_cancelled_when_its_terminal_closes(daemons, tmp_path: Path):
    d = daemons(gpus="emulated:1xA100-40GB")
    d.submit([sys.executable, "-c", "import time; time.sleep(60)"], mem="39GiB")
    term = Terminal(["run", "--mem", "1GiB", "--", "sh"], _env(d.state_dir))
    term.expect("waits")
    os.kill(term.pid, signal.SIGHUP)
    assert term.status() == 128 + signal.SIGHUP
    assert d.wait_state("2", "cancelled")["state"] == "cancelled"


def test_attach_is_refused_for_a_batch_job_and_the_exit_status_passes_through(daemons, tmp_path: Path):
    d = daemons(gpus="emulated:1xA100-40GB")
    batch = d.submit([sys.executable, "-c", "pass"], mem="1GiB")
    try:
        d.client.request("attach", id=batch)
        raise AssertionError("attached to a batch job")
    except CollocateError as exc:
        assert "not interactive" in str(exc)
    term = Terminal(["run", "--", "sh", "-c", "echo out; kill -TERM $$"], _env(d.state_dir))
    status = term.status()
    assert status == 128 + signal.SIGTERM, term.seen
    assert "out" in term.seen.decode(errors="replace")


def test_run_over_tcp_with_a_token(daemons, tmp_path: Path):
    d, port, pin = _remote(tmp_path, daemons)
    env = {k: v for k, v in _env(tmp_path / "nowhere").items()}
    env.update({"COLLOCATE_HOST": f"127.0.0.1:{port}", "COLLOCATE_TOKEN_FILE": str(tmp_path / "owner.token"),
                "COLLOCATE_FINGERPRINT": pin})
    term = Terminal(["run", "--mem", "1GiB", "--cwd", str(tmp_path), "--", "sh", "-i"], env)
    term.expect("$ ")
    term.type("echo over$((2*3))tls\n")
    term.expect("over6tls")
    term.type("exit 3\n")
    assert term.status() == 3
    wait_for(lambda: d.job("1")["state"] == "failed", 30, "the job to end")


@pytest.mark.skipif(why_no_lab() is not None, reason=str(why_no_lab()))
def test_a_member_runs_as_themselves_on_a_terminal_of_their_own(tmp_path: Path):
    """A root daemon: the job runs as the member, on a terminal the member owns; another
    member's attach is refused (``test_e2e_rights.py``)."""
    alice = lab_members()[0]
    work = work_dir()
    d = lab_daemon(gpus="emulated:1xA100-40GB")
    try:
        env = alice.env(TERM="xterm", COLLOCATE_STATE_DIR=str(d.state_dir))
        term = Terminal(["run", "--mem", "1GiB", "--cwd", str(work), "--", "sh", "-c",
                         'echo "uid $(id -u) owns $(stat -c %u "$(tty)")"; exit 4'], env, member=alice)
        term.expect(f"uid {alice.uid} owns {alice.uid}", timeout=90)
        assert term.status() == 4
    finally:
        stop_lab(d)


def test_a_notebook_server_is_told_the_tunnel_to_its_port(daemons, tmp_path: Path):
    """``collocate run -- jupyter lab --port 8888``: once placed, the member reads the ssh
    tunnel that reaches the port (a stand-in server: Python ignores the arguments after -c)."""
    d = daemons(gpus="emulated:1xA100-40GB")
    term = Terminal(["run", "--mem", "1GiB", "--", sys.executable, "-c", "print('notebook up')", "--port", "8888"],
                    _env(d.state_dir))
    shown = term.expect("notebook up")
    assert "to reach port 8888 from your machine: ssh -N -L 8888:127.0.0.1:8888 " in shown, shown
    assert term.status() == 0


def test_an_interactive_job_is_never_frozen_by_its_owner_or_for_a_job_of_higher_priority(daemons, tmp_path: Path):
    # issue 35: someone waits at its terminal. `suspend` is refused, and a job of higher
    # priority that would run if it stopped competing waits instead of freezing it.
    d = daemons("--policy", "exclusive", gpus="emulated:1xA100-40GB")
    term = Terminal(["run", "--mem", "1GiB", "--cwd", str(tmp_path), "--", "sh", "-i"], _env(d.state_dir))
    term.expect("$ ")
    with pytest.raises(CollocateError, match="is interactive: someone waits at its terminal; it is never suspended"):
        d.client.request("suspend", id="1")
    high = d.submit([sys.executable, "-c", "pass"], mem="1GiB", priority=5)
    waiting = wait_for(lambda: (j := d.job(high))["reason"] and j, 20, "the high job's wait to be known")
    assert waiting["state"] == "pending" and not d.job("1")["suspended"], (waiting, d.job("1"))
    term.type("echo still$((1+1))\n")
    term.expect("still2")  # the terminal answers: nothing of it was frozen
    term.type("exit 0\n")
    assert term.status() == 0
    assert d.wait_state(high, ("done", "failed"), timeout=30)["state"] == "done"
