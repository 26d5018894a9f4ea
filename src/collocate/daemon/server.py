"""The local API: a Unix domain socket (always) and a TCP listener (only with a token).

Who may talk to the daemon: on the Unix socket, the kernel tells us the peer's uid/gid
(``SO_PEERCRED``); a request is served only for the daemon's own user, root, or a member of the
configured group. The socket file is mode 0600 (0660 with a group) inside the 0700 state dir, so
the file system refuses others first and the credential check is the second lock. TCP has no
peer credentials, so a TCP client's first line must be ``{"token": "..."}`` with the token from
``--token-file`` (compared in constant time), read with a 4 KiB limit before anything else; jobs
submitted over TCP run as the daemon's user.

Bounds, so that no one peer (or user) can keep the others waiting:

* every message has an overall deadline (``protocol.LineReader``), not a per-read timeout: a
  request, and a TCP peer's token line, must arrive whole within 10 s of its first byte (the
  token within 10 s of connecting), and a connection idle 120 s between requests is closed;
* at most 256 connections are served at once on the Unix socket (a listen backlog of 1024
  waits behind them), and at most 16 of them per user other than the daemon's own and root,
  whose further connections are told at once that they hold too many;
* on TCP, peers that have not sent the token yet hold at most 64 threads, and a new one evicts
  the oldest of them (so peers trickling ``{"token":"`` cannot keep a token holder out); those
  with the token get 64 threads of their own, at most ``PER_TOKEN_CONNECTIONS`` (8, ``serve
  --tcp-max-per-token``) for the holders of one user's token, so no member fills the pool;
* TCP is TLS only (a token never crosses any socket in clear, loopback included);
* every listener is bound (``bind``) before any is served: a taken port is a clear error at
  start, never a daemon that serves half its listeners;
* refused tokens, refused peers and busy refusals go to the audit log (``daemon/audit.py``).
* any error inside a handler is answered as a clean error (its traceback goes to the daemon's
  log, never to the client).
"""

from __future__ import annotations

import hmac
import logging
import os
import pwd
import socket
import socketserver
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from collocate.common.errors import CollocateError, address_error
from collocate.daemon.audit import AuditLog
from collocate.daemon.faults import disk_full, is_disk_full
from collocate.wire import protocol
from collocate.wire.peers import Peer, Refused, authorize, peer_of
from collocate.wire.rights import NotAllowed

log = logging.getLogger("collocate.daemon")


class Busy(CollocateError):
    """Every connection slot is taken; try again."""


AUTH_TIMEOUT_S = 10.0  # a TCP peer must send its whole token line within this of connecting
REQUEST_TIMEOUT_S = 10.0  # a request must arrive whole within this of its first byte
IDLE_TIMEOUT_S = 120.0  # any connection idle this long between requests is closed
LISTEN_BACKLOG = 1024  # connections the kernel queues while every slot is busy (capped by somaxconn)
PER_USER_CONNECTIONS = 16  # Unix connections served at once per user (the owner and root excepted)
PER_TOKEN_CONNECTIONS = 8  # TCP connections served at once per token holder (``--tcp-max-per-token``)

Handler = Callable[[str, dict[str, Any], Peer], Any]


class _Connection(socketserver.StreamRequestHandler):
    server: _UnixServer | _TcpServer

    def setup(self) -> None:  # no buffered files: ``LineReader`` reads, ``_reply`` writes
        self.reader = protocol.LineReader(self.request)

    def finish(self) -> None:
        pass

    def handle(self) -> None:
        api: ApiServer = self.server.api
        connected = time.monotonic()
        try:
            peer = api.peer_for(self.request)
            if peer.tcp:  # nothing big is read, and nothing is parsed, before the token
                if isinstance(self.request, ssl.SSLSocket):  # the handshake, in this thread
                    self.request.settimeout(AUTH_TIMEOUT_S)
                    self.request.do_handshake()
                token = self.reader.read(protocol.MAX_AUTH_BYTES, idle_s=AUTH_TIMEOUT_S,
                                         finish_s=AUTH_TIMEOUT_S, deadline=connected + AUTH_TIMEOUT_S)
                peer = api.check_token((token or {}).get("token"))
                self.server.authenticated(self.request, peer)  # type: ignore[union-attr]
        except (Refused, Busy, protocol.ProtocolError, CollocateError) as exc:
            if isinstance(exc, Refused | Busy):
                api.audit.write("busy" if isinstance(exc, Busy) else "refused", why=str(exc.args[0]),
                                transport="unix" if self.request.family == socket.AF_UNIX else "tcp",
                                **_who(self.request, self.client_address))
            if self.request.family == socket.AF_UNIX:  # read the request first, so the client gets the reply
                try:
                    self.reader.read(protocol.MAX_AUTH_BYTES, idle_s=5.0, finish_s=5.0)
                except (OSError, CollocateError):
                    pass
            self._reply(protocol.error(exc))
            return
        except OSError:  # silent or gone before it authenticated
            return
        first = True
        while True:
            try:
                message = self.reader.read(protocol.MAX_MESSAGE_BYTES, finish_s=REQUEST_TIMEOUT_S,
                                           idle_s=min(REQUEST_TIMEOUT_S, api.idle_timeout_s) if first
                                           else api.idle_timeout_s)
            except CollocateError as exc:  # malformed, too long, too slow, not text
                self._reply(protocol.error(exc))
                return
            except OSError:  # the peer went away
                return
            if message is None:
                return
            first = False
            reply = answer(api, message, peer, audit=api.audit)
            if message.get("op") == "attach" and reply.get("ok"):  # collocate run: daemon/attach.py
                from collocate.daemon.attach import open_terminal, relay

                terminal = open_terminal(reply["result"])
                if self._reply(reply) and terminal is not None:
                    relay(self.request, terminal)
                elif terminal is not None:
                    terminal.close()
                if terminal is not None:
                    return
                continue
            if not self._reply(reply):
                return

    def _reply(self, reply: dict[str, Any]) -> bool:
        try:
            data = protocol.encode(reply)
        except protocol.ProtocolError as exc:  # e.g. a reply over the size limit
            data = protocol.encode(protocol.error(exc))
        try:
            self.request.settimeout(REQUEST_TIMEOUT_S)  # a peer that does not read is let go
            self.request.sendall(data)
            return True
        except OSError:
            return False


def _who(request: socket.socket, address: Any) -> dict[str, Any]:
    """Who is at the other end, for the audit log: a Unix peer's uid, a TCP peer's address."""
    if request.family == socket.AF_UNIX:
        try:
            return {"uid": peer_of(request).uid}
        except OSError:
            return {}
    return {"address": f"{address[0]}:{address[1]}"} if isinstance(address, tuple) else {}


def answer(api: ApiServer, message: dict[str, Any], peer: Peer, *, audit: AuditLog | None = None) -> dict[str, Any]:
    """The reply to one request: its result, its ``CollocateError``, or for anything else a
    clean "internal error" whose details (and traceback) go to the daemon's log only. With
    ``audit``: every submit and every refusal by the rights table is recorded."""
    op = message.get("op")
    transport = "tcp" if peer.tcp else "unix"
    try:
        op, args = protocol.check_request(message)
        result = api.handler(op, args, peer)
        if audit is not None and op == "submit" and isinstance(result, dict):
            audit.write("submit", user=peer.user, uid=peer.uid, transport=transport, job=result.get("id"))
        return protocol.ok(result)
    except NotAllowed as exc:
        if audit is not None:
            audit.write("rights", user=peer.user, uid=peer.uid, transport=transport, op=op, why=str(exc.args[0]))
        return protocol.error(exc)
    except CollocateError as exc:
        return protocol.error(exc)
    except Exception as exc:
        if is_disk_full(exc):
            return protocol.error(disk_full("the daemon's state"))
        log.exception("request %r from uid %d failed", op, peer.uid)
        return protocol.error(CollocateError(
            f"internal error ({type(exc).__name__}) while answering {op!r}",
            hint="the daemon logged the details in daemon.log; please report it"))


class _Capped:
    """At most ``max_connections`` connections served at once (each holds a thread). A new one
    waits up to ``slot_wait_s`` for a slot in the accept loop (the kernel's backlog holds the
    rest), then gets a "busy" reply; the client retries."""

    max_connections = 256
    slot_wait_s = 5.0

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._guard = threading.Lock()
        super().server_activate()  # type: ignore[misc]

    def turn_away(self, request: socket.socket, why: str) -> None:
        api = getattr(self, "api", None)
        if api is not None:
            api.audit.write("busy", why=why, transport="unix" if request.family == socket.AF_UNIX else "tcp",
                            **_who(request, _address_of(request)))
        try:
            request.settimeout(1.0)
            request.sendall(protocol.encode(protocol.error(Busy(
                f"the daemon is busy: {why}",
                hint="retry in a moment; collocate clients retry by themselves"))))
        except OSError:
            pass
        self.shutdown_request(request)  # type: ignore[attr-defined]

    def admit(self, request: socket.socket) -> bool:
        """Whether this connection may have a thread (a subclass's per-peer rule); may evict."""
        return True

    def process_request(self, request, client_address) -> None:
        if not self.admit(request):
            return
        if not self._slots.acquire(timeout=self.slot_wait_s):
            self.release(request)
            self.turn_away(request, "too many open connections")
            return
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except Exception:  # e.g. no thread could be started: never take the accept loop down
            self._slots.release()
            self.release(request)
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self.release(request)
            self._slots.release()

    def release(self, request: socket.socket) -> None:
        """Forget what ``admit`` counted for this connection."""


def _address_of(request: socket.socket) -> Any:
    try:
        return request.getpeername()
    except OSError:
        return None


class _UnixServer(_Capped, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    api: ApiServer

    def server_activate(self) -> None:
        self._per_uid: dict[int, int] = {}
        self._uid_of: dict[int, int] = {}  # id(request) -> uid it counts against
        super().server_activate()

    def admit(self, request: socket.socket) -> bool:
        try:
            uid = peer_of(request).uid
        except OSError:
            self.shutdown_request(request)
            return False
        if uid in (self.api.daemon_uid, 0):
            return True
        with self._guard:
            held = self._per_uid.get(uid, 0)
            if held < PER_USER_CONNECTIONS:
                self._per_uid[uid] = held + 1
                self._uid_of[id(request)] = uid
                return True
        self.turn_away(request, f"uid {uid} already has {held} connections open to it")
        return False

    def release(self, request: socket.socket) -> None:
        with self._guard:
            uid = self._uid_of.pop(id(request), None)
            if uid is not None:
                self._per_uid[uid] -= 1
                if not self._per_uid[uid]:
                    del self._per_uid[uid]


class _TcpServer(_Capped, socketserver.ThreadingMixIn, socketserver.TCPServer):
    """Peers before their token (``pending``, at most ``max_pending``, the oldest evicted for a
    newcomer) and peers with it (at most ``max_authenticated``) hold threads apart."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    max_pending = 64
    max_authenticated = 64
    max_connections = max_pending * 2 + max_authenticated  # evicted ones may still be ending
    slot_wait_s = 0.0
    api: ApiServer

    def get_request(self) -> tuple[socket.socket, Any]:
        """A new connection, wrapped for TLS when the daemon serves it (the handshake is done
        in the connection's thread, under its deadline, never in the accept loop)."""
        sock, address = self.socket.accept()
        if self.api.tls is not None:
            sock = self.api.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def server_activate(self) -> None:
        self._pending: OrderedDict[int, socket.socket] = OrderedDict()
        self._authenticated: dict[int, int] = {}  # id(request) -> uid of its token's holder
        super().server_activate()

    def admit(self, request: socket.socket) -> bool:
        with self._guard:
            while len(self._pending) >= self.max_pending:
                _, oldest = self._pending.popitem(last=False)
                try:
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread's read ends at once
                except OSError:
                    pass
            self._pending[id(request)] = request
        return True

    def authenticated(self, request: socket.socket, peer: Peer) -> None:
        """Move a peer that sent the token from the pending pool to its own; ``Busy`` if full,
        or if the holders of this token's user already have ``api.per_token`` connections."""
        with self._guard:
            self._pending.pop(id(request), None)
            if len(self._authenticated) >= self.max_authenticated:
                raise Busy("the daemon is busy: too many open connections",
                           hint="retry in a moment; collocate clients retry by themselves")
            held = sum(1 for uid in self._authenticated.values() if uid == peer.uid)
            if held >= self.api.per_token:
                raise Busy(f"the daemon is busy: {peer.user}'s token already has {held} connections "
                           "open to it", hint="close some (or wait for them to end); collocate "
                           "clients retry by themselves")
            self._authenticated[id(request)] = peer.uid

    def release(self, request: socket.socket) -> None:
        with self._guard:
            self._pending.pop(id(request), None)
            self._authenticated.pop(id(request), None)


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
        tls: ssl.SSLContext | None = None,
        user_tokens: Mapping[str, str] | None = None,
        per_token: int = PER_TOKEN_CONNECTIONS,
        audit: AuditLog | None = None,
    ) -> None:
        """``token``: the owner's (a TCP peer with it is the daemon's own user); ``user_tokens``:
        each member's, token → user name (a TCP peer with one is that user, as if it had come
        through the Unix socket); ``tls``: serve TCP over TLS with this context (TCP is TLS
        only); ``per_token``: TCP connections served at once per token holder; ``audit``: where
        refusals and submits are recorded (none: nowhere)."""
        if tcp is not None and not (token or user_tokens):
            raise CollocateError("a TCP listener needs a token", hint="pass --token-file FILE")
        if tcp is not None and tls is None:
            raise CollocateError("a TCP listener needs TLS: a token never crosses a socket in clear",
                                 hint="pass --tls self-signed, or --tls-cert and --tls-key")
        self.socket_path = Path(socket_path)
        self.handler = handler
        self.allow_gid = allow_gid
        self.daemon_uid = os.getuid()
        self.token = token
        self.user_tokens = dict(user_tokens or {})
        self.tls = tls
        self.idle_timeout_s = idle_timeout_s
        self.per_token = per_token
        self.audit = audit or AuditLog(None)
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._tcp_address = tcp

    def bind(self) -> None:
        """Bind every listener, serving none yet; a taken address is a ``CollocateError`` (and
        nothing stays bound), so ``serve`` fails at once instead of serving half its listeners."""
        if self._servers:
            return
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
            try:
                tcp = _TcpServer(self._tcp_address, _Connection)
            except OSError as exc:
                self.stop()
                raise address_error(self._tcp_address, exc, "--tcp") from None
            tcp.api = self
            self._servers.append(tcp)

    def start(self) -> None:
        """Bind (if not yet) and serve every listener, each from a thread."""
        self.bind()
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

    def check_token(self, token: Any) -> Peer:
        """Who a TCP peer is, by its token: the daemon's owner, or the member it was given to."""
        if isinstance(token, str) and token:
            if self.token and hmac.compare_digest(token.encode(), self.token.encode()):
                return Peer(uid=self.daemon_uid, gid=os.getgid(), tcp=True)
            for known, user in self.user_tokens.items():  # every entry compared: no early exit
                if hmac.compare_digest(token.encode(), known.encode()):
                    try:
                        pw = pwd.getpwnam(user)
                    except KeyError:
                        raise Refused(f"the token's user {user!r} is unknown on this machine",
                                      hint="ask the daemon's owner to fix --user-tokens") from None
                    return Peer(uid=pw.pw_uid, gid=pw.pw_gid, tcp=True)
        raise Refused("missing or wrong token", hint="pass the token you were given with "
                      "--token-file or COLLOCATE_TOKEN_FILE")

    def stop(self) -> None:
        serving = len(self._threads)
        for i, s in enumerate(self._servers):
            if i < serving:  # ``shutdown`` waits for a ``serve_forever`` that never ran otherwise
                s.shutdown()
            s.server_close()
        self._servers = []
        for t in self._threads:
            t.join(timeout=2.0)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
