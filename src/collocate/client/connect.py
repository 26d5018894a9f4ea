"""Talk to a running daemon: one request per call over its Unix socket (or TCP with a token).

Every failure to reach the daemon becomes a ``CollocateError`` whose hint says what to do:
start the daemon, use the right ``--state-dir``, or ask the owner for access.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from collocate.common.errors import CollocateError
from collocate.wire import protocol
from collocate.wire.paths import StateLayout, client_state_dir, lab_state_dir

CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 90.0
RETRY_FOR_S = 15.0  # how long a request is retried after a broken connection or a busy daemon


ENV_HOST, ENV_TOKEN_FILE = "COLLOCATE_HOST", "COLLOCATE_TOKEN_FILE"
ENV_FINGERPRINT, ENV_CA_FILE = "COLLOCATE_FINGERPRINT", "COLLOCATE_CA_FILE"


def client_for(state_dir: str | Path | None = None, *, host: str | None = None,
               token_file: Path | None = None, fingerprint: str | None = None,
               ca_file: Path | None = None) -> Client:
    """The client a command uses: the daemon at ``host`` (``HOST:PORT``, else
    ``COLLOCATE_HOST``) over TCP with the token in ``token_file`` (else
    ``COLLOCATE_TOKEN_FILE``), over TLS pinned to ``fingerprint`` (else
    ``COLLOCATE_FINGERPRINT``) or checked against ``ca_file``; without a host, the state dir's
    Unix socket."""
    host = host or os.environ.get(ENV_HOST) or None
    if host is None:
        return Client(state_dir)
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit():
        raise CollocateError(f"cannot read the daemon's address {host!r}", hint="write HOST:PORT, e.g. head:7070")
    path = token_file or (Path(os.environ[ENV_TOKEN_FILE]) if os.environ.get(ENV_TOKEN_FILE) else None)
    if path is None:
        raise CollocateError(f"a daemon over TCP ({host}) needs your token",
                             hint=f"pass --token-file FILE or set {ENV_TOKEN_FILE}")
    from collocate.common.tls import read_secret

    try:
        token = read_secret(path, "the token file").strip()
    except OSError as exc:
        raise CollocateError(f"cannot read the token file {path}: {exc}") from exc
    ca = ca_file or (Path(os.environ[ENV_CA_FILE]) if os.environ.get(ENV_CA_FILE) else None)
    return Client(state_dir, tcp=(name.strip("[]"), int(port)), token=token,
                  fingerprint=fingerprint or os.environ.get(ENV_FINGERPRINT) or None, ca_file=ca)


def no_daemon_hint(state_dir: Path) -> str:
    """What to do when no daemon answers: on a machine with a lab daemon, never "start your own"
    (a second scheduler on the lab's GPUs); else how to start one."""
    lab = lab_state_dir()
    if lab is not None:
        return (f"this machine's lab daemon ({lab}) is not answering: it may be restarting "
                "(jobs keep running); check `systemctl status collocate-lab` or ask the lab's admin")
    return ("start it with `collocate serve` (on a machine without GPUs: `collocate serve --gpus "
            "emulated:4xA100-40GB`), or pass the --state-dir / COLLOCATE_STATE_DIR it uses")


class DaemonNotRunning(CollocateError):
    """No daemon listens on the state dir's socket."""


class _Retry(Exception):
    """A failure worth another try; ``error`` is raised when time is up."""

    def __init__(self, error: CollocateError, *, sent: bool) -> None:
        super().__init__(str(error))
        self.error, self.sent = error, sent


def job_pages(request: Callable[..., Any], **args: Any) -> Iterator[dict[str, Any]]:
    """Every row of ``ls`` (with ``args``: ``all``, ``ids``), one bounded page per request, so a
    queue of any size never makes a reply too big (``request`` is ``Client.request`` or the
    dashboard's in-process twin)."""
    after = 0
    while True:
        page = request("ls", after=after, **args)
        yield from (row for row in page if int(row["id"]) > after)
        if len(page) < protocol.PAGE_ROWS or int(page[-1]["id"]) <= after:
            return  # the last page (or a daemon from before pages, which sent every row at once)
        after = int(page[-1]["id"])


def list_jobs(request: Callable[..., Any], **args: Any) -> list[dict[str, Any]]:
    """``job_pages`` as a list; ``ids`` asked in pages of ``protocol.PAGE_ROWS`` too."""
    ids = args.pop("ids", None)
    if ids is None:
        return list(job_pages(request, **args))
    ids = list(ids)
    return [row for i in range(0, len(ids), protocol.PAGE_ROWS)
            for row in job_pages(request, ids=ids[i:i + protocol.PAGE_ROWS], **args)]


class Client:
    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        tcp: tuple[str, int] | None = None,
        token: str | None = None,
        timeout_s: float = REPLY_TIMEOUT_S,
        fingerprint: str | None = None,
        ca_file: Path | None = None,
    ) -> None:
        """Over the state dir's Unix socket, or with ``tcp`` over TCP with ``token``, always over
        TLS: the daemon's certificate must match ``fingerprint`` (pinned) or be signed by
        ``ca_file``'s CA before a byte of the token is sent (loopback included: any local user
        may listen on a port the daemon is not on)."""
        self.state_dir = client_state_dir(state_dir) if tcp is None else Path(state_dir or ".")
        self.socket_path = StateLayout(self.state_dir).socket
        self.tcp, self.token, self.timeout_s = tcp, token, timeout_s
        self.fingerprint, self.ca_file = fingerprint, ca_file

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and return its result. Safe to retry, so it is retried: a submit
        carries an idempotency ``key`` (the daemon answers a repeated key with the job it
        already stored), and a connection that breaks before the reply, a full listen backlog
        or a busy daemon are tried again for up to ``RETRY_FOR_S``."""
        if op == "submit" and not args.get("key"):
            args["key"] = os.urandom(16).hex()  # 128 random bits, as uuid4 (without its import)
        message: dict[str, Any] = {"op": op, "args": args}
        protocol.encode(message)  # too big is an error now, not something to retry
        deadline = time.monotonic() + RETRY_FOR_S
        delay, sent = 0.05, False
        while True:
            try:
                return self._request_once(message, sent_before=sent)
            except _Retry as retry:
                sent = sent or retry.sent
                if time.monotonic() + delay > deadline:
                    raise retry.error from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _request_once(self, message: dict[str, Any], *, sent_before: bool) -> Any:
        try:
            sock = self._connect()
        except DaemonNotRunning as exc:
            if sent_before:  # it was there a moment ago: a restart, most likely
                raise _Retry(exc, sent=True) from None
            raise
        except BlockingIOError as exc:  # the listen backlog is full
            raise _Retry(CollocateError(
                "the collocate daemon is overloaded: too many clients are connecting at once",
                hint="retry in a moment, or submit from fewer processes at a time"), sent=False) from exc
        try:
            sock.settimeout(self.timeout_s)
            if self.tcp is not None:  # the token goes first, on a line of its own
                sock.sendall(protocol.encode({"token": self.token}))
            return protocol.call(sock, message)
        except TimeoutError as exc:
            raise CollocateError(
                f"the daemon did not answer within {self.timeout_s:.0f} s",
                hint=f"check it is healthy: see {self.state_dir / 'daemon.log'} or its terminal",
            ) from exc
        except (ConnectionError, protocol.ProtocolError) as exc:
            raise _Retry(CollocateError(
                f"the connection to the daemon broke before it replied ({exc})",
                hint="check the daemon is running (`collocate ls`); a repeated submit is safe"),
                sent=True) from None
        except CollocateError as exc:
            if str(exc.args[0] if exc.args else "").startswith(("the daemon is busy", "the daemon is shutting down")):
                raise _Retry(exc, sent=True) from None
            raise
        finally:
            sock.close()

    def _connect(self) -> socket.socket:
        if self.tcp is not None:
            host = self.tcp[0]
            secure = self.fingerprint is not None or self.ca_file is not None
            if not secure:
                raise CollocateError(f"refusing to send the token to {host}:{self.tcp[1]} before "
                                     "the daemon proves who it is",
                                     hint="pin the daemon's certificate: --fingerprint or "
                                          "COLLOCATE_FINGERPRINT (printed by `collocate serve --tcp ...`)")
            try:
                sock = socket.create_connection(self.tcp, timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:
                raise DaemonNotRunning(
                    f"cannot reach a collocate daemon at {self.tcp[0]}:{self.tcp[1]}: {exc}",
                    hint="check the address and that the daemon was started with --tcp",
                ) from exc
            from collocate.common.tls import client_socket

            return client_socket(sock, pin=self.fingerprint, ca_file=self.ca_file, host=host)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(os.fspath(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise DaemonNotRunning(
                f"the collocate daemon is not running (no daemon on {self.socket_path})",
                hint=no_daemon_hint(self.state_dir)) from exc
        except BlockingIOError:
            sock.close()
            raise
        except PermissionError as exc:
            sock.close()
            raise CollocateError(
                f"permission denied on {self.socket_path}: this daemon belongs to another user",
                hint="ask its owner (on a lab server: the lab's admin) to add you to the group it "
                "serves (--group), then log in again") from exc
        return sock
