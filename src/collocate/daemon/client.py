"""Talk to a running daemon: one request per call over its Unix socket (or TCP with a token).

Every failure to reach the daemon becomes a ``CollocateError`` whose hint says what to do:
start the daemon, use the right ``--state-dir``, or ask the owner for access.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from collocate.daemon import protocol
from collocate.daemon.paths import StateLayout, resolve_state_dir
from collocate.errors import CollocateError

CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 90.0


class DaemonNotRunning(CollocateError):
    """No daemon listens on the state dir's socket."""


class Client:
    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        tcp: tuple[str, int] | None = None,
        token: str | None = None,
        timeout_s: float = REPLY_TIMEOUT_S,
    ) -> None:
        self.state_dir = resolve_state_dir(state_dir)
        self.socket_path = StateLayout(self.state_dir).socket
        self.tcp, self.token, self.timeout_s = tcp, token, timeout_s

    def request(self, op: str, **args: Any) -> Any:
        message: dict[str, Any] = {"op": op, "args": args}
        if self.token is not None:
            message["token"] = self.token
        sock = self._connect()
        try:
            sock.settimeout(self.timeout_s)
            return protocol.call(sock, message)
        except TimeoutError as exc:
            raise CollocateError(
                f"the daemon did not answer within {self.timeout_s:.0f} s",
                hint=f"check it is healthy: see {self.state_dir / 'daemon.log'} or its terminal",
            ) from exc
        finally:
            sock.close()

    def _connect(self) -> socket.socket:
        if self.tcp is not None:
            try:
                return socket.create_connection(self.tcp, timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:
                raise DaemonNotRunning(
                    f"cannot reach a collocate daemon at {self.tcp[0]}:{self.tcp[1]}: {exc}",
                    hint="check the address and that the daemon was started with --tcp",
                ) from exc
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(os.fspath(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise DaemonNotRunning(
                f"the collocate daemon is not running (no daemon on {self.socket_path})",
                hint="start it with `collocate serve` (on a machine without GPUs: "
                "`collocate serve --gpus emulated:4xA100-40GB`), or pass the --state-dir / "
                "COLLOCATE_STATE_DIR it uses",
            ) from exc
        except PermissionError as exc:
            sock.close()
            raise CollocateError(
                f"permission denied on {self.socket_path}: this daemon belongs to another user",
                hint="ask its owner to start it with --group GROUP including you, or run your "
                "own with `collocate serve --state-dir DIR`",
            ) from exc
        return sock
