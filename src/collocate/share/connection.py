"""Consumer side of the control socket: handshake, reading, heartbeats, liveness.

The training thread reads the socket itself when it waits for a batch (``get``): a batch
notification costs one ``recvmsg`` and no hand-off between threads. A housekeeping thread wakes
every 50 ms to send heartbeats, run the consumer's ``tick`` and keep the producer-death
watchdog; it also drains the socket whenever the training thread is not reading it (during a
training step), so the producer's sends never back up and its last words are seen. Whoever
reads holds ``_io``, so messages stay in order. EOF (the producer exited or was killed: the
kernel closes its socket) or ``timeout`` seconds without any message (it hangs) become a
``ProducerLostError`` that the training thread raises at its next wait. DETACH and END carry
the producer's reason. No wait in this module is unbounded.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
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
from collocate.share.protocol import VERSION, Msg, decode, encode, recv, recv_one, send

TICK_S = 0.05  # housekeeping period
WAIT_S = 0.1  # longest single blocking read (SO_RCVTIMEO): errors and closing are noticed this fast
_DELIVER = (Msg.START, Msg.BATCH, Msg.EPOCH_END)


class Connection:
    """One consumer's connection to a producer; ``tick`` runs on the housekeeping thread every
    ``TICK_S``, ``on_wait`` on the calling thread just before ``get`` blocks."""

    def __init__(self, address: str, name: str, *, timeout: float, connect_timeout: float,
                 label: str = "") -> None:
        self.name, self.timeout = name, timeout
        self.sock = _connect(address, name, connect_timeout)
        self._send_lock = threading.Lock()
        self._io = threading.Lock()  # held by whichever thread reads the socket
        self._queue: collections.deque[tuple[Msg, Any]] = collections.deque()
        self._error: ShareError | None = None
        self._closed = threading.Event()
        self.tick: Callable[[], None] = lambda: None
        self.on_wait: Callable[[], None] = lambda: None
        self.send(encode(Msg.HELLO, payload={"v": VERSION, "pid": os.getpid(), "label": label}))
        self.welcome, self.ring_fd = self._await_welcome()
        self.heartbeat_s = float(self.welcome["heartbeat_s"])
        self._last_heard = time.monotonic()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, int(WAIT_S * 1e6)))
        self._thread = threading.Thread(target=self._housekeep, name=f"share-{name}-reader", daemon=True)
        self._thread.start()

    def send(self, message: bytes) -> None:
        """Send one message. A failed send is not reported here: the producer's last words (DETACH,
        END) may still be queued for reading, and the next read reaches EOF right after them."""
        with self._send_lock:
            try:
                send(self.sock, message)
            except OSError:
                pass

    def get(self, deadline: float | None) -> tuple[Msg, Any]:
        """Next message for the consumer; raises the connection's error, or ``TimeoutError`` at ``deadline``."""
        queue = self._queue
        while True:
            if self._error is not None:
                raise self._error
            if queue:
                return queue.popleft()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            with self._io:  # waits only while the housekeeping thread drains (microseconds)
                if queue:  # it drained while we took the lock: those come first
                    continue
                item = self._next(0.1 if remaining is None else min(0.1, remaining))
            if item is not None:
                return item

    def drain(self) -> list[tuple[Msg, Any]]:
        """Take every queued message (read but not yet consumed)."""
        items = []
        while self._queue:
            items.append(self._queue.popleft())
        return items

    def wait_error(self, timeout: float) -> ShareError | None:
        """Read for up to ``timeout`` s to surface a pending DETACH/END; return it if any."""
        deadline = time.monotonic() + timeout
        while self._error is None and not self._closed.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with self._io:
                item = self._next(min(0.1, remaining))
            if item is not None:
                self._queue.append(item)
        return self._error

    @property
    def error(self) -> ShareError | None:
        return self._error

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2)
        try:
            self.sock.close()
        except OSError:
            pass
        if self.ring_fd is not None:
            os.close(self.ring_fd)
            self.ring_fd = None

    # ------------------------------------------------------------------ reading (caller holds _io)
    def _next(self, wait: float) -> tuple[Msg, Any] | None:
        """The next deliverable message, waiting up to about ``wait`` s for one; ``None`` if none
        came (or the connection failed: ``_error`` says so)."""
        item = self._read()
        if item is None and wait > 0 and self._error is None:
            self.on_wait()
            if wait >= WAIT_S:
                item = self._read(block=True)  # one blocking recvmsg, bounded by SO_RCVTIMEO
            else:  # a deadline is near: wait exactly that long
                try:
                    select.select([self.sock], [], [], wait)
                except (OSError, ValueError):
                    pass  # closed or broken: the read says which
                item = self._read()
        return item

    def _read(self, block: bool = False) -> tuple[Msg, Any] | None:
        """Read datagrams until one is for the consumer; ``None`` when none is left (``block``:
        when none came within ``WAIT_S``)."""
        while self._error is None:
            try:
                data = recv_one(self.sock, block=block)
                if data is None:
                    return None
                if not data:
                    self._fail(ProducerLostError(
                        f"producer {self.name!r} closed the connection: it exited or was killed",
                        hint="restart the producer (collocate share serve ...) and then this job"))
                    return None
                self._last_heard = time.monotonic()
                kind, body = decode(data)
            except ProtocolError as exc:
                self._fail(exc)
                return None
            except (OSError, ValueError) as exc:
                self._fail(ShareError(f"the connection to producer {self.name!r} is closed",
                                      hint="create a new SharedLoader") if self._closed.is_set() else
                           ProducerLostError(f"connection to producer {self.name!r} failed: {exc}"))
                return None
            if kind in _DELIVER:
                return kind, body
            if kind is Msg.HEARTBEAT:
                continue
            if kind is Msg.DETACH:
                self._fail(ConsumerDetachedError(
                    f"producer {self.name!r} detached this consumer: {body['reason']}",
                    hint="call loader.detach() around long pauses (evaluation, checkpoints), keep batch tensors "
                    "only until the next step (or use copy=True), or raise the producer's stall_timeout_s"))
            elif kind is Msg.END:
                self._fail(ProducerLostError(f"producer {self.name!r} stopped: {body['reason']}",
                                             hint="restart the producer, then this job"))
            else:
                self._fail(ProtocolError(f"unexpected {kind.name} from the producer"))
        return None

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
                if body.get("backend", "cpu") == "cpu" and len(fds) != 1:
                    raise ProtocolError("WELCOME without the ring descriptor")
                return body, (fds[0] if fds else None)
            for fd in fds:
                os.close(fd)
            if kind in (Msg.DETACH, Msg.END):
                self.sock.close()
                raise ConsumerDetachedError(f"producer {self.name!r} refused this consumer: {body['reason']}")
            raise ProtocolError(f"unexpected {kind.name} before WELCOME")

    def _housekeep(self) -> None:
        next_beat = 0.0
        beat = encode(Msg.HEARTBEAT)
        while not self._closed.wait(TICK_S) and self._error is None:
            if self._io.acquire(blocking=False):  # else the training thread is reading right now
                try:
                    while (item := self._read()) is not None:
                        self._queue.append(item)
                finally:
                    self._io.release()
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

    def _fail(self, error: ShareError) -> None:
        if self._error is None:
            self._error = error


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
