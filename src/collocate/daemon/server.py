"""The local API: a Unix domain socket (always) and a TCP listener (only with a token).

Who may talk to the daemon: on the Unix socket, the kernel tells us the peer's uid/gid
(``SO_PEERCRED``); a request is served only for the daemon's own user, root, or a member of the
configured group. The socket file is mode 0600 (0660 with a group) inside the 0700 state dir, so
the file system refuses others first and the credential check is the second lock. TCP has no
peer credentials, so every TCP request must carry the token from ``--token-file`` (compared in
constant time); jobs submitted over TCP run as the daemon's user.
"""

from __future__ import annotations

import grp
import hmac
import os
import pwd
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collocate.daemon import protocol
from collocate.errors import CollocateError


@dataclass(frozen=True, slots=True)
class Peer:
    """Who sent a request: from the socket's peer credentials, or a token-holding TCP client."""

    uid: int
    gid: int
    pid: int = 0
    tcp: bool = False

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)


class Refused(CollocateError):
    """A peer that may not use this daemon."""


def peer_of(sock: socket.socket) -> Peer:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return Peer(uid=uid, gid=gid, pid=pid)


def authorize(peer: Peer, *, daemon_uid: int, allow_gid: int | None) -> None:
    """Raise ``Refused`` unless the peer is the daemon's user, root, or in the allowed group."""
    if peer.uid in (daemon_uid, 0):
        return
    if allow_gid is not None:
        if peer.gid == allow_gid:
            return
        try:
            members = grp.getgrgid(allow_gid).gr_mem
        except KeyError:
            members = []
        if peer.user in members:
            return
    raise Refused(
        f"user {peer.user} (uid {peer.uid}) may not use this collocate daemon",
        hint="ask its owner to start it with --group GROUP including you, or run your own "
        "daemon with `collocate serve --state-dir DIR`",
    )


Handler = Callable[[str, dict[str, Any], Peer], Any]


class _Connection(socketserver.StreamRequestHandler):
    server: _UnixServer | _TcpServer

    def handle(self) -> None:
        api: ApiServer = self.server.api
        try:
            peer = api.peer_for(self.request)
        except Refused as exc:
            self.request.settimeout(5.0)  # read the request first, so the client gets the reply
            try:
                protocol.read_message(self.rfile)
            except (OSError, protocol.ProtocolError):
                pass
            self._reply(protocol.error(exc))
            return
        while True:
            try:
                message = protocol.read_message(self.rfile)
            except protocol.ProtocolError as exc:
                self._reply(protocol.error(exc))
                return
            if message is None:
                return
            try:
                if peer.tcp:
                    api.check_token(message.get("token"))
                op, args = protocol.check_request(message)
                reply = protocol.ok(api.handler(op, args, peer))
            except CollocateError as exc:
                reply = protocol.error(exc)
            except Exception as exc:
                reply = protocol.error(CollocateError(f"internal error: {type(exc).__name__}: {exc}",
                                                      hint="see the daemon's log"))
            if not self._reply(reply):
                return

    def _reply(self, reply: dict[str, Any]) -> bool:
        try:
            self.wfile.write(protocol.encode(reply))
            self.wfile.flush()
            return True
        except (OSError, protocol.ProtocolError):
            return False


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128
    api: ApiServer


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    api: ApiServer


class ApiServer:
    """Serves requests by calling ``handler(op, args, peer)`` on a thread per connection."""

    def __init__(
        self,
        socket_path: Path,
        handler: Handler,
        *,
        allow_gid: int | None = None,
        tcp: tuple[str, int] | None = None,
        token: str | None = None,
    ) -> None:
        if tcp is not None and not token:
            raise CollocateError("a TCP listener needs a token", hint="pass --token-file FILE")
        self.socket_path = Path(socket_path)
        self.handler = handler
        self.allow_gid = allow_gid
        self.daemon_uid = os.getuid()
        self.token = token
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._tcp_address = tcp

    def start(self) -> None:
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        old = os.umask(0o117 if self.allow_gid is not None else 0o177)
        try:
            unix = _UnixServer(str(self.socket_path), _Connection)
        finally:
            os.umask(old)
        if self.allow_gid is not None:
            os.chown(self.socket_path, -1, self.allow_gid)
            os.chmod(self.socket_path, 0o660)
        unix.api = self
        self._servers.append(unix)
        if self._tcp_address is not None:
            tcp = _TcpServer(self._tcp_address, _Connection)
            tcp.api = self
            self._servers.append(tcp)
        for s in self._servers:
            t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.5},
                                 name=f"api-{type(s).__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def tcp_port(self) -> int | None:
        for s in self._servers:
            if isinstance(s, _TcpServer):
                return s.server_address[1]
        return None

    def peer_for(self, sock: socket.socket) -> Peer:
        if sock.family == socket.AF_UNIX:
            peer = peer_of(sock)
            authorize(peer, daemon_uid=self.daemon_uid, allow_gid=self.allow_gid)
            return peer
        return Peer(uid=self.daemon_uid, gid=os.getgid(), tcp=True)

    def check_token(self, token: Any) -> None:
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), (self.token or "").encode()):
            raise Refused("missing or wrong token", hint="pass the daemon's --token-file to the client")

    def stop(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()
        for t in self._threads:
            t.join(timeout=2.0)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
