"""Consumer side of the control socket: handshake, a reader thread, heartbeats, liveness.

The reader thread turns incoming datagrams into a queue of (type, body) items and keeps the
producer-death watchdog: EOF (the producer exited or was killed: the kernel closes its socket)
or ``timeout`` seconds without any message (it hangs) become a ``ProducerLostError`` that the
training thread raises at its next wait. DETACH and END carry the producer's reason. No wait in
this module is unbounded.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from collocate.share.errors import (
    ConsumerDetachedError,
    ProducerLostError,
    ProducerNotFoundError,
    ProtocolError,
    ShareError,
)
from collocate.share.protocol import VERSION, Msg, decode, encode, recv, send


class Connection:
    """One consumer's connection to a producer; ``tick`` runs on the reader thread every ~50 ms."""

    def __init__(self, address: str, name: str, *, timeout: float, connect_timeout: float,
                 label: str = "") -> None:
        self.name, self.timeout = name, timeout
        self.sock = _connect(address, name, connect_timeout)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Msg, Any]] = collections.deque()
        self._error: ShareError | None = None
        self._closed = False
        self.tick: Callable[[], None] = lambda: None
        self.send(encode(Msg.HELLO, payload={"v": VERSION, "pid": os.getpid(), "label": label}))
        self.welcome, self.ring_fd = self._await_welcome()
        self.heartbeat_s = float(self.welcome["heartbeat_s"])
        self._last_heard = time.monotonic()
        self._thread = threading.Thread(target=self._read_loop, name=f"share-{name}-reader", daemon=True)
        self._thread.start()

    def send(self, message: bytes) -> None:
        """Send one message. A failed send is not reported here: the producer's last words (DETACH,
        END) may still be queued for reading, and the reader thread reaches EOF right after them."""
        with self._send_lock:
            try:
                send(self.sock, message)
            except OSError:
                pass

    def get(self, deadline: float | None) -> tuple[Msg, Any]:
        """Next queued item; raises the connection's error, or ``TimeoutError`` at ``deadline``."""
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._queue:
                    return self._queue.popleft()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                self._cond.wait(0.1 if remaining is None else min(0.1, remaining))

    def drain(self) -> list[tuple[Msg, Any]]:
        with self._cond:
            items = list(self._queue)
            self._queue.clear()
            return items

    def wait_error(self, timeout: float) -> ShareError | None:
        """Give the reader thread ``timeout`` s to surface a pending DETACH/END; return it if any."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None, timeout)
            return self._error

    @property
    def error(self) -> ShareError | None:
        return self._error

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        try:
            self.sock.close()
        except OSError:
            pass
        if self.ring_fd is not None:
            os.close(self.ring_fd)
            self.ring_fd = None

    # ------------------------------------------------------------------
    def _await_welcome(self) -> tuple[dict[str, Any], int | None]:
        """Wait for WELCOME; the producer may still be loading its first batch (heartbeats flow)."""
        last = time.monotonic()
        while True:
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready:
                if time.monotonic() - last > self.timeout:
                    self.sock.close()
                    raise ProducerLostError(f"producer {self.name!r} accepted but went silent for {self.timeout:g} s",
                                            hint="it may be hung; check its process and log")
                continue
            data, fds = recv(self.sock, with_fds=True)
            last = time.monotonic()
            if not data:
                self.sock.close()
                raise ProducerLostError(f"producer {self.name!r} closed the connection during the handshake",
                                        hint="check the producer's log (a loader error ends it)")
            kind, body = decode(data)
            if kind is Msg.HEARTBEAT:  # the producer may take a while for its first batch: stay alive
                self.send(encode(Msg.HEARTBEAT))
                continue
            if kind is Msg.WELCOME:
                if body.get("v") != VERSION:
                    raise ProtocolError(f"producer speaks protocol {body.get('v')}, this consumer {VERSION}")
                if body.get("backend") == "cpu" and len(fds) != 1:
                    raise ProtocolError("WELCOME without the ring descriptor")
                return body, (fds[0] if fds else None)
            for fd in fds:
                os.close(fd)
            if kind in (Msg.DETACH, Msg.END):
                self.sock.close()
                raise ConsumerDetachedError(f"producer {self.name!r} refused this consumer: {body['reason']}")
            raise ProtocolError(f"unexpected {kind.name} before WELCOME")

    def _read_loop(self) -> None:
        next_beat = 0.0
        beat = encode(Msg.HEARTBEAT)
        while not self._closed and self._error is None:
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.05)
                if ready:
                    self._read_one()
            except (OSError, ValueError) as exc:
                if not self._closed:
                    self._fail(ProducerLostError(f"connection to producer {self.name!r} failed: {exc}"))
                break
            except ProtocolError as exc:
                self._fail(exc)
                break
            now = time.monotonic()
            if now - self._last_heard > self.timeout:
                self._fail(ProducerLostError(
                    f"producer {self.name!r} sent nothing for {self.timeout:g} s: it is hung or its host is overloaded",
                    hint="check the producer process; raise timeout= on SharedLoader if this is expected"))
                break
            if now >= next_beat:
                next_beat = now + self.heartbeat_s
                self.send(beat)
            self.tick()

    def _read_one(self) -> None:
        data, _ = recv(self.sock)
        if not data:
            self._fail(ProducerLostError(
                f"producer {self.name!r} closed the connection: it exited or was killed",
                hint="restart the producer (collocate share serve ...) and then this job"))
            return
        self._last_heard = time.monotonic()
        kind, body = decode(data)
        if kind is Msg.HEARTBEAT:
            return
        if kind is Msg.DETACH:
            self._fail(ConsumerDetachedError(
                f"producer {self.name!r} detached this consumer: {body['reason']}",
                hint="call loader.detach() around long pauses (evaluation, checkpoints), keep batch tensors "
                "only until the next step (or use copy=True), or raise the producer's stall_timeout_s"))
            return
        if kind is Msg.END:
            self._fail(ProducerLostError(f"producer {self.name!r} stopped: {body['reason']}",
                                         hint="restart the producer, then this job"))
            return
        if kind not in (Msg.START, Msg.BATCH, Msg.EPOCH_END):
            raise ProtocolError(f"unexpected {kind.name} from the producer")
        with self._cond:
            self._queue.append((kind, body))
            self._cond.notify_all()

    def _fail(self, error: ShareError) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()


def _connect(address: str, name: str, connect_timeout: float) -> socket.socket:
    """Connect, retrying until ``connect_timeout`` so consumers may start before the producer."""
    deadline = time.monotonic() + connect_timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(address)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() >= deadline:
                raise ProducerNotFoundError(
                    f"no shared producer named {name!r} answered within {connect_timeout:g} s",
                    hint=f"start one with `collocate share serve module:factory --name {name}` "
                    "(same user and state directory), or raise connect_timeout=") from None
            time.sleep(0.05)
