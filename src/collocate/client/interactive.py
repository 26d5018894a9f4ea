"""``collocate run``: an interactive job (Slurm's ``srun --pty``), queued like any other.

It is submitted with ``interactive`` set, waits in the queue showing one live line (its
position and why it waits, as ``collocate ls`` says), then this terminal is attached to the
job's own pseudo-terminal through the daemon (``attach``: ``daemon/attach.py``, frames in
``node/ptyjob.py``): keys go to the job raw (Ctrl-C is SIGINT for its foreground process, as in
a local shell), window-size changes follow, its output comes back, and this command exits
with the job's exit status (128 + N for a signal N). When this command goes (the terminal is
closed, the connection is lost), the job is hung up and ends; a job still queued is cancelled.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
import termios
import time
import tty
from pathlib import Path
from typing import Annotated, Any

import typer

from collocate.common.cli_options import ErrorOpt, FingerprintOpt, HostOpt, OutputOpt, StateDirOpt, TokenFileOpt
from collocate.common.errors import CollocateError, InputError

POLL_S = 0.5  # how often a queued job's state is asked


def run(
    command: Annotated[list[str] | None, typer.Argument(help="The command, after --.")] = None,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs the job needs.")] = 1,
    mem: Annotated[str | None, typer.Option("--mem", help="GPU memory per GPU, with a unit: "
                   "8GiB, 6144MiB (as `collocate submit --mem`).")] = None,
    name: Annotated[str | None, typer.Option("--name", "-J", help="The job's name in `ls` (as srun -J; "
                    "default: from the command).")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", "-t", help="Time limit, as Slurm "
                          "reads it: 30 (minutes), HH:MM:SS, 2h, 1d.")] = None,
    priority: Annotated[int, typer.Option("--priority", help="Higher runs first (above 0: the "
                        "daemon's owner only).")] = 0,
    nice: Annotated[int | None, typer.Option("--nice", help="Lower this job's priority by N.")] = None,
    cwd: Annotated[Path | None, typer.Option("--cwd", help="Working directory (default: here).")] = None,
    env: Annotated[list[str], typer.Option("--env", help="NAME=VALUE for the job (repeatable).")] = [],  # noqa: B006 - Typer passes a new list
    output: OutputOpt = None, error: ErrorOpt = None,
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Run a command interactively on a GPU, through the queue (Slurm's srun --pty):
    collocate run --mem 8GiB -- bash

    It waits in the queue like any job (one live line: position and why it waits), then runs
    on a terminal attached to yours: keys, Ctrl-C, window size and exit status pass through.
    It ends when the command ends or your terminal goes; a job still queued is cancelled.

    A notebook (it prints the ssh tunnel to open):
    collocate run --mem 8GiB -- jupyter lab --no-browser --port 8888 --ip 127.0.0.1
    """
    from collocate.client.connect import client_for
    from collocate.common.units import parse_duration, parse_mib, require_unit
    from collocate.wire.spec import parse_env

    if not command:
        raise InputError("empty command", hint="put the command after --, e.g. collocate run --mem 8GiB -- bash")
    parse_env(env)
    if nice is not None:
        if priority:
            raise InputError("give --priority or --nice, not both", hint="--nice N is --priority -N")
        priority = -nice
    if time_limit is not None:
        parse_duration(time_limit)
    if mem is not None:
        require_unit(mem, "--mem")
        parse_mib(mem)
    directory = (cwd or Path.cwd()).expanduser().absolute()
    if not directory.is_dir():
        raise InputError(f"working directory {directory} does not exist", hint="pass an existing --cwd")
    from collocate.wire.outputs import check_directory

    check_directory(output, "--output", str(directory))
    check_directory(error, "--error", str(directory))
    client = client_for(state_dir, host=host, token_file=token_file, fingerprint=fingerprint)
    job_id = str(client.request("submit", argv=list(command), name=name, gpus=gpus, mem=mem,
                                priority=priority, cwd=str(directory), env=list(env),
                                base_env=dict(os.environ), time=time_limit, interactive=True,
                                output=output, error=error)["id"])
    raise typer.Exit(Session(client, job_id, list(command)).run())


class Session:
    """One ``collocate run``: wait for the job, then be its terminal."""

    def __init__(self, client: Any, job_id: str, argv: list[str]) -> None:
        self.client, self.job_id, self.argv = client, job_id, argv
        self.resized = True  # the first size goes out on attach
        self.gone: int | None = None  # a signal that ends this command (SIGHUP, SIGTERM)
        self.live = sys.stderr.isatty()

    def run(self) -> int:
        def leave(signum: int, _frame: Any) -> None:
            self.gone = signum

        for sig in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, leave)
        signal.signal(signal.SIGWINCH, lambda *_: setattr(self, "resized", True))
        try:
            sock, early = self._wait()
        except KeyboardInterrupt:
            self._cancel()
            self._line("")
            typer.echo(f"job {self.job_id} cancelled (Ctrl-C while it was queued)", err=True)
            return 130
        if sock is None:
            self._cancel()
            return 128 + (self.gone or signal.SIGHUP)
        return self._attached(sock, early)

    # -- queued ----------------------------------------------------------------------------
    def _wait(self) -> tuple[socket.socket | None, bytes]:
        """Until the job's terminal is ours: the connection and the first bytes of the stream;
        (None, b"") if this command was told to go first."""
        sock = self._open()
        said = ""
        last_ls = 0.0
        try:
            while self.gone is None:
                reply, rest = self._ask(sock)
                if reply.get("state") == "running":
                    self._line("")
                    self._tunnel_hint(str(reply.get("node") or "the node"))
                    return sock, rest
                now = time.monotonic()
                if reply.get("state") == "pending" and now - last_ls > 2.0:
                    said, last_ls = self._queue_line(), now
                elif reply.get("state") == "starting":
                    said = f"job {self.job_id}: starting"
                self._line(said)
                time.sleep(POLL_S)
        except BaseException:
            sock.close()
            raise
        sock.close()
        return None, b""

    def _open(self) -> socket.socket:
        sock = self.client._connect()  # the Client's own door: Unix socket, or TCP + TLS
        sock.settimeout(30.0)
        if self.client.tcp is not None:
            from collocate.wire import protocol

            sock.sendall(protocol.encode({"token": self.client.token}))
        return sock

    def _ask(self, sock: socket.socket) -> tuple[dict[str, Any], bytes]:
        """One ``attach`` on the connection: its result, and any stream bytes after it."""
        from collocate.wire import protocol

        sock.sendall(protocol.encode({"op": "attach", "args": {"id": self.job_id}}))
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise CollocateError("the daemon closed the connection", hint="check it is running "
                                     f"(`collocate ls`); job {self.job_id} ends without its terminal")
            data += chunk
        line, rest = data.split(b"\n", 1)
        reply = protocol.decode(line)
        if not reply.get("ok"):
            raise CollocateError(str(reply.get("error")), hint=reply.get("hint"))
        return reply["result"], rest

    def _queue_line(self) -> str:
        from collocate.client.connect import list_jobs

        rows = list_jobs(self.client.request, ids=[self.job_id])
        if not rows:
            return f"job {self.job_id}: queued"
        row = rows[0]
        where = f"position {row['position']}" if row.get("position") else "queued"
        why = f": {row['reason']}" if row.get("reason") else ""
        return f"job {self.job_id} waits, {where}{why}"

    def _line(self, text: str) -> None:
        """The one live line (on a terminal; elsewhere each new text once)."""
        from collocate.common.safetext import printable

        if self.live:
            sys.stderr.write("\r\x1b[K" + live_line(text, os.get_terminal_size(sys.stderr.fileno()).columns))
            if not text:
                sys.stderr.write("\r")
        elif text and text != getattr(self, "_said", None):
            sys.stderr.write(printable(text) + "\n")
        self._said = text
        sys.stderr.flush()

    def _tunnel_hint(self, node: str) -> None:
        port = _port_of(self.argv)
        if port is not None:
            typer.echo(f"job {self.job_id} runs on {node}; to reach port {port} from your machine: "
                       f"ssh -N -L {port}:127.0.0.1:{port} {node}", err=True)

    def _cancel(self) -> None:
        try:
            self.client.request("cancel", id=self.job_id)
        except CollocateError:
            pass

    # -- attached --------------------------------------------------------------------------
    def _attached(self, sock: socket.socket, early: bytes) -> int:
        from collocate.node.ptyjob import KEEPALIVE_S, Frames, frame, window_size, winsize_frame

        stdin = sys.stdin.fileno()
        saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
        if saved is not None:
            tty.setraw(stdin)
        frames, status = Frames(), None
        reading_keys, sent = True, time.monotonic()
        try:
            for kind, payload in frames.feed(early):
                status = self._show(kind, payload, status)
            while status is None and self.gone is None:
                if self.resized:
                    self.resized = False
                    size = window_size(stdin) or window_size(sys.stdout.fileno())
                    if size is not None:
                        sock.sendall(winsize_frame(*size))
                if time.monotonic() - sent > KEEPALIVE_S:
                    sock.sendall(frame(b"p"))
                    sent = time.monotonic()
                try:
                    ready, _, _ = select.select([sock] + ([stdin] if reading_keys else []), [], [], 0.2)
                except InterruptedError:
                    continue
                if stdin in ready:
                    keys = os.read(stdin, 65536)
                    if not keys:  # stdin ended (not a terminal): the job's terminal gets EOF
                        reading_keys = False
                        keys = b"\x04"
                    sock.sendall(frame(b"d", keys))
                    sent = time.monotonic()
                if sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        break
                    for kind, payload in frames.feed(data):
                        status = self._show(kind, payload, status)
        except KeyboardInterrupt:  # stdin not a terminal: Ctrl-C here reached only us
            pass
        except OSError:
            pass
        finally:
            sock.close()  # the job's terminal hangs up, if it has not ended
            if saved is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if status is not None:
            return status if status >= 0 else 128 - status
        if self.gone is not None:
            return 128 + self.gone
        typer.echo(f"\r\ncollocate: lost the connection to job {self.job_id}; it is hung up and "
                   f"ends (`collocate show {self.job_id}`)", err=True)
        return 255

    def _show(self, kind: bytes, payload: bytes, status: int | None) -> int | None:
        if kind == b"o":
            out = sys.stdout.buffer
            out.write(payload)
            out.flush()
        elif kind == b"x":
            return int(struct.unpack("!i", payload)[0])
        return status


def _port_of(argv: list[str]) -> int | None:
    """The port a server command names (``--port 8888``, ``--port=8888``), for the tunnel hint."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg in ("--port", "-p") and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith(("--port=", "--ServerApp.port=")) else None
        if value is not None and value.isdigit():
            return int(value)
    return None


def live_line(text: str, columns: int) -> str:
    """The live line in a terminal ``columns`` wide: one column short of it (a line that
    fills the terminal wraps the cursor to the next), ending in ``…`` where it was cut; the
    whole reason is in `collocate show`."""
    from collocate.client.render import cut
    from collocate.common.safetext import printable

    return cut(printable(text), max(columns - 1, 10))
