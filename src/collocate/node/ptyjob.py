"""An interactive job's terminal (``collocate run``): the job on a pseudo-terminal its runner
opens, served to one attached client at a time.

The runner (``collocate.node.runner --pty``) starts the job as the leader of a new session
whose controlling terminal is the pty's slave side, so keys typed by the member reach the job
as on a login: Ctrl-C is the byte 0x03 and the terminal driver turns it into SIGINT for the
job's foreground process group, a window size set on the master (``TIOCSWINSZ``) reaches the
job as SIGWINCH, and a hang-up (the master closed) is SIGHUP. The runner keeps the master and
listens on ``pty.sock`` in the attempt's folder (0600, the daemon's user: only the daemon
connects; it relays a member's ``attach`` after checking they own the job, see
``daemon/attach.py``). Everything the job prints is also kept in its ``stdout.log``.

The wire between the client and the runner (the daemon only copies bytes) is framed both ways,
``KIND`` (1 byte) + length (2 bytes, big-endian) + payload:

* client → job: ``d`` keys, ``w`` window size (rows, columns: two 16-bit numbers), ``p`` a
  keep-alive (sent every ``KEEPALIVE_S``);
* job → client: ``o`` output, ``x`` the job's exit status (a signed 32-bit number: the exit code,
  or minus the signal), sent last.

The job ends with its terminal: when the attached client goes (its connection closes, or is
silent for ``SILENT_S``), or when no client attached within ``FIRST_ATTACH_S`` of the start, the
job gets SIGHUP (the master is closed), then SIGKILL after ``HANGUP_GRACE_S``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import socket
import struct
import termios
import time
from pathlib import Path

SOCKET_NAME = "pty.sock"
FIRST_ATTACH_S = 120.0  # a job nobody attached to by then is hung up (its client died queued)
SILENT_S = 60.0  # an attached client silent this long is gone (a TCP peer that vanished)
KEEPALIVE_S = 15.0
HANGUP_GRACE_S = 10.0
BACKLOG_BYTES = 64 * 1024  # output kept for a client that attaches after the job printed it
_HEADER = struct.Struct("!cH")
MAX_PAYLOAD = 0xFFFF


# -- the frames ----------------------------------------------------------------------------------
def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame; output longer than a frame's payload is split into several."""
    out = []
    for at in range(0, max(len(payload), 1), MAX_PAYLOAD):
        chunk = payload[at:at + MAX_PAYLOAD]
        out.append(_HEADER.pack(kind, len(chunk)) + chunk)
    return b"".join(out)


def winsize_frame(rows: int, cols: int) -> bytes:
    return frame(b"w", struct.pack("!HH", rows, cols))


def exit_frame(status: int) -> bytes:
    return frame(b"x", struct.pack("!i", status))


class Frames:
    """Frames out of a byte stream that arrives in pieces."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            frames.append((kind, self.buffer[_HEADER.size:_HEADER.size + size]))
            self.buffer = self.buffer[_HEADER.size + size:]
        return frames


def unix_address(path: Path) -> tuple[str, int | None]:
    """An address ``bind``/``connect`` accept for ``path``: the path itself, or, when it is
    longer than a Unix socket's address allows, the same file through ``/proc/self/fd`` of its
    folder (the fd is returned, to be closed once the call is done)."""
    if len(os.fsencode(path)) < 100:
        return str(path), None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def connect(path: Path, timeout_s: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    address, fd = unix_address(path)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)
    return sock


# -- the runner's side ---------------------------------------------------------------------------
class Terminal:
    """The pty and its socket, made by the runner before it forks the job."""

    def __init__(self, folder: Path, owner: int | None = None) -> None:
        self.master, self.slave = os.openpty()
        if owner is not None:  # the member's terminal is theirs, as a login's is (mesg, tty checks)
            os.fchown(self.slave, owner, -1)
        self.path = folder / SOCKET_NAME
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = unix_address(self.path)
        old = os.umask(0o177)  # 0600: the daemon's user alone may connect
        try:
            self.path.unlink(missing_ok=True)
            self.listener.bind(address)
        finally:
            os.umask(old)
            if fd is not None:
                os.close(fd)
        self.listener.listen(2)
        self.client: socket.socket | None = None
        self.frames = Frames()

    def enter_child(self) -> None:
        """In the job's process: a new session whose controlling terminal is the pty, on its
        stdin, stdout and stderr."""
        os.setsid()
        fcntl.ioctl(self.slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(self.slave, fd)
        for fd in (self.slave, self.master, self.listener.fileno()):
            os.close(fd)

    def await_client(self, stops: list[int]) -> bool:
        """Before the job starts: wait for its member's client (within ``FIRST_ATTACH_S``, until
        a stop), and apply the window size it sends first, so the job starts on a terminal
        shown and sized. False: nobody came, the job is not started."""
        deadline = time.monotonic() + FIRST_ATTACH_S
        while not stops and time.monotonic() < deadline:
            try:
                if not select.select([self.listener], [], [], 0.25)[0]:
                    continue
            except InterruptedError:
                continue
            self.client, _ = self.listener.accept()
            self.client.settimeout(10.0)
            if select.select([self.client], [], [], 1.0)[0]:
                data = self.client.recv(65536)
                if not data:
                    self.client.close()
                    self.client = None
                    continue
                for kind, payload in self.frames.feed(data):
                    _apply(kind, payload, self.master)
            return True
        return False

    def serve(self, pid: int, log_fd: int, stops: list[int], exclude: set[int]) -> int:
        """Relay the job's terminal to the attached client until the job ends; its exit status
        (as ``runner.wait_status``: the code, or minus the signal)."""
        os.close(self.slave)
        started = time.monotonic()
        client, frames = self.client, self.frames
        heard = started
        backlog = b""
        hung_up_at: float | None = None
        forwarded = 0
        master: int | None = self.master
        status: int | None = None
        while status is None:
            status = _exited(pid)
            if status is not None:
                break
            now = time.monotonic()
            while forwarded < len(stops):  # a cancel or time limit: to the job's whole session
                _signal_session(pid, stops[forwarded])
                forwarded += 1
                hung_up_at = hung_up_at or now
            gone = (client is not None and now - heard > SILENT_S) or \
                   (client is None and hung_up_at is None and now - started > FIRST_ATTACH_S)
            if gone and hung_up_at is None:
                hung_up_at = now
                _hang_up(master, pid)
                master = None
            if hung_up_at is not None and now - hung_up_at > HANGUP_GRACE_S:
                kill_session(pid, exclude)
            readers = [self.listener] + ([master] if master is not None else []) + \
                      ([client] if client is not None else [])
            try:
                ready, _, _ = select.select(readers, [], [], 0.25)
            except InterruptedError:
                continue
            if self.listener in ready:
                conn, _ = self.listener.accept()
                if client is not None or hung_up_at is not None:  # one terminal, one client
                    conn.close()
                else:
                    client, heard = conn, time.monotonic()
                    client.settimeout(10.0)
                    if backlog and not _send(client, frame(b"o", backlog)):
                        client = None
            if master is not None and master in ready:
                data = _read(master)
                if not data:  # every holder of the slave closed it: the job is ending
                    os.close(master)
                    master = None
                else:
                    _write_all(log_fd, data)
                    if client is None:
                        backlog = (backlog + data)[-BACKLOG_BYTES:]
                    elif not _send(client, frame(b"o", data)):
                        client = None
                        hung_up_at = time.monotonic()
                        _hang_up(master, pid)
                        master = None
            if client is not None and client in ready:
                try:
                    data = client.recv(65536)
                except OSError:
                    data = b""
                if not data:  # the member's terminal went away: so does the job's
                    client.close()
                    client = None
                    if hung_up_at is None:
                        hung_up_at = time.monotonic()
                        _hang_up(master, pid)
                        master = None
                    continue
                heard = time.monotonic()
                for kind, payload in frames.feed(data):
                    _apply(kind, payload, master)
        if master is not None:  # what the job printed last
            until = time.monotonic() + 1.0  # a background process may hold the terminal on
            while time.monotonic() < until and (data := _read(master, wait_s=0.05)):
                _write_all(log_fd, data)
                if client is not None and not _send(client, frame(b"o", data)):
                    client = None
            os.close(master)
        kill_session(pid, exclude)  # nothing the job started outlives it (its zombie: harmless)
        if client is not None:
            # at the end, so the client has the whole output before it exits with the status
            _send(client, exit_frame(status))
            client.close()
        self.listener.close()
        self.path.unlink(missing_ok=True)
        return status


def _apply(kind: bytes, payload: bytes, master: int | None) -> None:
    if master is None:
        return
    if kind == b"d":
        _write_all(master, payload)
    elif kind == b"w" and len(payload) == 4:
        rows, cols = struct.unpack("!HH", payload)
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _exited(pid: int) -> int | None:
    """The job's status once it has exited, without reaping it (``runner.wait_status``)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    except ChildProcessError:
        return -signal.SIGKILL
    if info is None or not info.si_pid:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _hang_up(master: int | None, pid: int) -> None:
    """The terminal goes away: the kernel sends SIGHUP to the session on the master's close."""
    if master is not None:
        os.close(master)
    _signal_session(pid, signal.SIGHUP)
    return None


def _signal_session(pid: int, sig: int) -> None:
    for member in _session(pid):
        try:
            os.kill(member, sig)
        except OSError:
            pass


def kill_session(pid: int, exclude: set[int]) -> None:
    """SIGKILL every process of the job's session (what an unconfined job's tree is)."""
    for member in _session(pid):
        if member not in exclude:
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass


def _session(leader: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == leader:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _read(fd: int, wait_s: float = 0.0) -> bytes:
    if wait_s and not select.select([fd], [], [], wait_s)[0]:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError as exc:  # EIO: the slave side is closed
        if exc.errno in (errno.EIO, errno.EBADF):
            return b""
        raise


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:
            return  # a full log disk or a closed terminal: the job goes on


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        sock.close()
        return False


def window_size(fd: int) -> tuple[int, int] | None:
    """The terminal ``fd``'s (rows, columns), or None when it is no terminal."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return rows, cols

