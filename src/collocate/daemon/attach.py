"""``attach``: a member's connection relayed to their interactive job's terminal.

The API handler (``Api.op_attach``, on the loop thread) checks that the asker owns the job
(``rights.py``) and says where the job's runner serves its terminal (``pty.sock`` in the
attempt's folder, 0600, the daemon's user); the connection's own thread then connects there,
answers ``ok`` and copies bytes both ways until either side closes: the frames are the client's
and the runner's business (``node/ptyjob.py``). Over TCP the same happens on the TLS
connection the member authenticated with their token, so ``--host`` works as the Unix socket
does. When the member's side closes, the runner's side is closed, which hangs the job up.
"""

from __future__ import annotations

import select
import socket
import ssl
from pathlib import Path
from typing import Any

from collocate.common.errors import CollocateError
from collocate.node.ptyjob import connect

SEND_TIMEOUT_S = 30.0  # a side that takes no bytes this long is let go


def open_terminal(result: dict[str, Any]) -> socket.socket | None:
    """The runner's terminal for ``op_attach``'s result (None while the job waits)."""
    path = result.pop("socket", None)
    if path is None:
        return None
    try:
        return connect(Path(path))
    except OSError:  # the runner has not opened it yet (it starts in a moment), or is gone
        result["state"] = "starting"
        return None


def relay(member: socket.socket, runner: socket.socket) -> None:
    """Copy bytes both ways until one side closes; then close the other."""
    member.settimeout(SEND_TIMEOUT_S)
    runner.settimeout(SEND_TIMEOUT_S)
    other = {member: runner, runner: member}
    try:
        while True:
            ready = [s for s in (member, runner) if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready, _, _ = select.select([member, runner], [], [])
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                other[sock].sendall(data)
    except (OSError, CollocateError):
        return
    finally:
        runner.close()

