"""The local API: a Unix domain socket (always) and a TCP listener (only with a token).

Who may talk to the daemon: on the Unix socket, the kernel tells us the peer's uid/gid
(``SO_PEERCRED``); a request is served only for the daemon's own user, root, or a member of the
configured group. The socket file is mode 0600 (0660 with a group) inside the 0700 state dir, so
the file system refuses others first and the credential check is the second lock. TCP has no
peer credentials, so a TCP client's first line must be ``{"token": "..."}`` with the token from
``--token-file`` (compared in constant time), read with a 4 KiB limit and a 10 s timeout before
anything else; jobs submitted over TCP run as the daemon's user.

Bounds: at most 256 connections served at once on the Unix socket (64 on TCP, where the rest
are turned away at once), a listen backlog of 1024, and every connection closed after 120 s
idle, so neither a crowd of clients nor slow or silent peers exhaust the daemon.
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
from collocate.daemon.faults import describe_error, disk_full, is_disk_full
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


class Busy(CollocateError):
    """Every connection slot is taken; try again."""


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


AUTH_TIMEOUT_S = 10.0  # a TCP peer must send its token line within this
IDLE_TIMEOUT_S = 120.0  # any connection idle this long between requests is closed
LISTEN_BACKLOG = 1024  # connections the kernel queues while every slot is busy (capped by somaxconn)

Handler = Callable[[str, dict[str, Any], Peer], Any]


class _Connection(socketserver.StreamRequestHandler):
    server: _UnixServer | _TcpServer

    def handle(self) -> None:
        api: ApiServer = self.server.api
        self.request.settimeout(AUTH_TIMEOUT_S if self.request.family != socket.AF_UNIX else api.idle_timeout_s)
        try:
            peer = api.peer_for(self.request)
            if peer.tcp:  # nothing big is read, and nothing is parsed, before the token
                api.check_token((protocol.read_message(self.rfile, protocol.MAX_AUTH_BYTES) or {}).get("token"))
                self.request.settimeout(api.idle_timeout_s)
        except (Refused, protocol.ProtocolError) as exc:
            if self.request.family == socket.AF_UNIX:
                self.request.settimeout(5.0)  # read the request first, so the client gets the reply
                try:
                    protocol.read_message(self.rfile, protocol.MAX_AUTH_BYTES)
                except (OSError, protocol.ProtocolError):
                    pass
            self._reply(protocol.error(exc))
            return
        except OSError:  # silent or gone before it authenticated
            return
        while True:
            try:
                message = protocol.read_message(self.rfile)
            except protocol.ProtocolError as exc:
                self._reply(protocol.error(exc))
                return
            except OSError:  # idle past idle_timeout_s, or the peer went away
                return
            if message is None:
                return
            try:
                op, args = protocol.check_request(message)
                reply = protocol.ok(api.handler(op, args, peer))
            except CollocateError as exc:
                reply = protocol.error(exc)
            except Exception as exc:
                reply = protocol.error(CollocateError(f"internal error: {describe_error(exc)}",
                                                      hint="see the daemon's log")
                                       if not is_disk_full(exc) else disk_full("the daemon's state"))
            if not self._reply(reply):
                return

    def _reply(self, reply: dict[str, Any]) -> bool:
        try:
            self.wfile.write(protocol.encode(reply))
            self.wfile.flush()
            return True
        except (OSError, protocol.ProtocolError):
            return False


class _Capped:
    """At most ``max_connections`` connections served at once (each holds a thread). A new one
    waits up to ``slot_wait_s`` for a slot in the accept loop (the kernel's backlog holds the
    rest), then gets a "busy" reply; the client retries."""

    max_connections = 256
    slot_wait_s = 5.0

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().server_activate()  # type: ignore[misc]

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(timeout=self.slot_wait_s):
            try:
                request.settimeout(1.0)
                request.sendall(protocol.encode(protocol.error(Busy(
                    "the daemon is busy: too many open connections",
                    hint="retry in a moment; collocate clients retry by themselves"))))
            except OSError:
                pass
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        super().process_request(request, client_address)  # type: ignore[misc]

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots.release()


class _UnixServer(_Capped, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    api: ApiServer


class _TcpServer(_Capped, socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    max_connections = 64  # unauthenticated peers hold at most this many threads...
    slot_wait_s = 0.0  # ...and are turned away at once beyond it
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
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        if tcp is not None and not token:
            raise CollocateError("a TCP listener needs a token", hint="pass --token-file FILE")
        self.socket_path = Path(socket_path)
        self.handler = handler
        self.allow_gid = allow_gid
        self.daemon_uid = os.getuid()
        self.token = token
        self.idle_timeout_s = idle_timeout_s
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
