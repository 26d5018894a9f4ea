"""The producer: runs one input pipeline and publishes every batch into the shared ring.

Two threads. The *fill* thread (the caller's, in ``run``) iterates the loader, epoch after epoch,
waits until the next slot is free, copies the batch in and publishes it. The *control* thread
owns the sockets: it accepts consumers, answers HELLO/ATTACH/RELEASE/PAUSE, sends heartbeats and
detaches consumers that stopped talking. Both change shared state only under one condition
variable, and every socket send happens under it, so each consumer sees messages in order.

Slot reuse rule: batch ``seq`` goes to slot ``seq % slots`` and may only be written when no peer
still holds ``seq - slots``. If no consumer is attached the producer fills the ring and waits, so
the first consumer to arrive finds ``slots`` batches ready. If the oldest slot is held longer than
``stall_timeout_s`` the holders are detached (with an error that says why) and the rest go on.

Shutdown order (``stop`` or SIGTERM/SIGINT): (1) the stop flag is set; (2) the control thread
sends END to every consumer, closes their sockets and the listening socket, so the name vanishes
and consumers fail fast; (3) the fill thread finishes its current ``next(loader)``, drops the
iterator (DataLoader workers exit) and (4) unmaps and closes the ring. Nothing is ever created in
the file system, so a SIGKILL leaves nothing behind either (see ``naming`` and ``ring``).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, overload

from collocate.share import naming
from collocate.share.errors import ProducerExistsError, ProtocolError, ShareError
from collocate.share.layout import Layout, layout_for
from collocate.share.peers import Peer, PeerState
from collocate.share.protocol import (
    VERSION,
    Batch,
    Msg,
    decode,
    encode,
    recv,
    send_within,
)
from collocate.share.ring import RingWriter

log = logging.getLogger("collocate.share")
_CRED = struct.Struct("3i")
SEND_TIMEOUT_S = 2.0  # a consumer that reads nothing for this long while its queue is full is dropped


@dataclass(frozen=True)
class ProducerConfig:
    """Knobs of a producer; defaults suit one server with a few consumers.

    slots: ring size, which bounds how far the fastest consumer may run ahead of the slowest.
    heartbeat_s: how often each side proves it is alive.
    consumer_timeout_s: a consumer silent this long is detached (SIGSTOP, hung interpreter).
    stall_timeout_s: how long the slowest consumer may hold back everyone before it is detached.
    capacity: samples per slot; default is the first batch's size.
    samples_per_epoch: for ``len()`` on consumers when it cannot be derived from the loader.
    device: "cpu" (shared-memory ring) or a CUDA device (CUDA IPC ring, untested on GPU).
    """

    slots: int = 8
    heartbeat_s: float = 0.5
    consumer_timeout_s: float = 5.0
    stall_timeout_s: float = 10.0
    capacity: int | None = None
    samples_per_epoch: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        from collocate.common.errors import InputError

        if not 2 <= self.slots <= 4096:
            raise InputError(f"slots={self.slots} is out of range", hint="use 2..4096 (default 8)")
        for key in ("heartbeat_s", "consumer_timeout_s", "stall_timeout_s"):
            if getattr(self, key) <= 0:
                raise InputError(f"{key} must be positive", hint=f"got {getattr(self, key)}")
        if self.consumer_timeout_s < 2 * self.heartbeat_s:
            raise InputError("consumer_timeout_s must be at least twice heartbeat_s",
                             hint="a single late heartbeat must not detach a healthy consumer")


class Producer:
    """Serve ``loader`` under ``name``; use ``run()`` (blocking) or ``start()`` (thread)."""

    def __init__(self, loader: Iterable[Any], name: str, *, state_dir: str | os.PathLike[str] | None = None,
                 config: ProducerConfig | None = None) -> None:
        naming.check_platform()
        self.name = naming.validate_name(name)
        self.config = config or ProducerConfig()
        self._loader = loader
        self._address = naming.socket_address(name, state_dir)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._peers: dict[int, Peer] = {}
        self._layout: Layout | None = None
        self._ring: Any = None
        self._meta: dict[int, Batch] = {}  # slot -> batch it holds
        self._head = 0  # next sequence number to publish
        self._oldest_valid = 0  # lowest sequence number whose slot still holds it
        self._last_epoch_done = -1
        self._epoch_samples: dict[int, int] = {}
        self._samples_per_epoch = self.config.samples_per_epoch or _samples_per_epoch(loader)
        self._error: BaseException | None = None
        self._stats = {"batches": 0, "samples": 0, "detached": 0, "started": time.time()}
        self._listener = self._bind()
        self._control = threading.Thread(target=self._control_loop, name=f"share-{name}-control", daemon=True)
        self._control.start()
        self._fill_thread: threading.Thread | None = None

    # ---------------------------------------------------------------- public API
    @property
    def address(self) -> str:
        return self._address

    def run(self) -> dict[str, Any]:
        """Run the pipeline until ``stop()``; return final statistics. Re-raises loader errors."""
        try:
            self._fill()
        except BaseException as exc:  # loader or layout error: tell consumers, then re-raise
            self._error = exc
            raise
        finally:
            self.stop()
            self._control.join(timeout=5)
            with self._cond:
                if self._ring is not None:
                    self._ring.close()
                    self._ring = None
        return self.stats()

    def start(self) -> Producer:
        """Run in a background thread (in-process use and tests); ``stop()`` ends it."""
        self._fill_thread = threading.Thread(target=self._run_quietly, name=f"share-{self.name}-fill", daemon=True)
        self._fill_thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the producer to shut down (idempotent, callable from signal handlers)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if timeout is not None and self._fill_thread is not None:
            self._fill_thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                **self._stats, "name": self.name, "pid": os.getpid(), "ready": self._layout is not None,
                "head": self._head, "slots": self.config.slots,
                "consumers": [{"pid": p.pid, "label": p.label, "state": p.state.value, "held": len(p.held),
                               "delivered": p.delivered} for p in self._peers.values()],
            }

    # ---------------------------------------------------------------- fill thread
    def _run_quietly(self) -> None:
        try:
            self.run()
        except BaseException:
            log.exception("shared producer %s failed", self.name)

    def _fill(self) -> None:
        seq, epoch = 0, 0
        while not self._stop.is_set():
            offset = 0
            iterator = iter(self._loader)
            try:
                for batch in iterator:
                    if self._stop.is_set():
                        return
                    if self._layout is None:
                        self._build_ring(batch)
                    assert self._layout is not None
                    tensors, count = self._layout.flatten(batch, seq)
                    if count == 0:
                        continue
                    if not self._reserve(seq):
                        return
                    self._ring.write(seq % self.config.slots, seq, tensors, count)
                    self._publish(Batch(seq % self.config.slots, seq, epoch, offset, count))
                    seq, offset = seq + 1, offset + count
            finally:
                del iterator  # a DataLoader shuts its workers down here
            if offset == 0:
                raise ShareError(f"the loader served as {self.name!r} yielded no samples in epoch {epoch}",
                                 hint="check the dataset is not empty and drop_last does not drop everything")
            self._end_epoch(epoch, offset)
            epoch += 1

    def _build_ring(self, batch: Any) -> None:
        layout = layout_for(batch, self.config.capacity)
        if self.config.device == "cpu":
            ring: Any = RingWriter(layout, self.config.slots)
        else:
            from collocate.share.cuda_ipc import CudaRingWriter

            ring = CudaRingWriter(layout, self.config.slots, self.config.device)
        with self._cond:
            self._layout, self._ring = layout, ring
            for peer in list(self._peers.values()):
                if peer.state is PeerState.WAITING:
                    self._welcome(peer)
        log.info("shared producer %s ready: %d slots of %.2f MiB", self.name, self.config.slots,
                 layout.slot_bytes / 2**20)

    def _reserve(self, seq: int) -> bool:
        """Wait until slot ``seq % slots`` is free; detach consumers that stall it too long."""
        old = seq - self.config.slots
        waited_since = time.monotonic()
        with self._cond:
            while not self._stop.is_set():
                if old < 0:
                    break
                if not any(p.state is PeerState.ACTIVE for p in self._peers.values()):
                    waited_since = time.monotonic()  # nobody to serve: keep the ring full and wait
                    self._cond.wait(0.1)
                    continue
                holders = [p for p in self._peers.values() if old in p.held]
                if not holders:
                    break
                if time.monotonic() - waited_since > self.config.stall_timeout_s:
                    for p in holders:
                        self._detach(p, "stalled", (
                            f"{p.describe()} held batch {old} for more than {self.config.stall_timeout_s:g} s "
                            f"while the others waited (lag limit: {self.config.slots} slots)"))
                    continue
                self._cond.wait(0.05)
            else:
                return False
            self._oldest_valid = max(0, seq - self.config.slots + 1)
            return True

    def _publish(self, batch: Batch) -> None:
        message = encode(Msg.BATCH, batch.slot, batch.seq, batch.epoch, batch.offset, batch.size)
        with self._cond:
            self._meta[batch.slot] = batch
            self._head = batch.seq + 1
            self._stats["batches"] += 1
            self._stats["samples"] += batch.size
            for peer in list(self._peers.values()):
                if peer.state is PeerState.ACTIVE:
                    peer.held.add(batch.seq)
                    peer.delivered += 1
                    self._send(peer, message)
            self._cond.notify_all()

    def _end_epoch(self, epoch: int, samples: int) -> None:
        with self._cond:
            self._last_epoch_done = epoch
            self._epoch_samples[epoch] = samples
            if self._samples_per_epoch is None:
                self._samples_per_epoch = samples
            elif samples != self._samples_per_epoch:
                log.warning("epoch %d of %s had %d samples, expected %d: consumers' epochs will not align",
                            epoch, self.name, samples, self._samples_per_epoch)
            message = encode(Msg.EPOCH_END, epoch, samples)
            for peer in list(self._peers.values()):
                if peer.state is PeerState.ACTIVE:
                    self._send(peer, message)

    # ---------------------------------------------------------------- control thread
    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self._address)
        except OSError:
            sock.close()
            raise ProducerExistsError(
                f"a producer named {self.name!r} is already running for this state directory",
                hint="stop it first (lifecycle.stop_producer / kill its process) or pick another name",
            ) from None
        sock.listen(64)
        return sock

    def _control_loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=min(0.1, self.config.heartbeat_s)):
                    if key.data is None:
                        self._accept(selector)
                    else:
                        self._receive(selector, key.data)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.config.heartbeat_s
                    self._beat(now)
        finally:
            self._shutdown_sockets(selector)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        pid, uid, _gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        if uid != os.getuid():
            log.warning("refused a connection from uid %d (pid %d): only the owner may attach", uid, pid)
            conn.close()
            return
        conn.setblocking(False)  # sends wait at most SEND_TIMEOUT_S (send_within); reads follow epoll
        peer = Peer(conn, pid)
        with self._cond:
            self._peers[conn.fileno()] = peer
        selector.register(conn, selectors.EVENT_READ, peer)

    def _receive(self, selector: selectors.BaseSelector, peer: Peer) -> None:
        try:
            data, fds = recv(peer.sock)
            for fd in fds:
                os.close(fd)
            if not data:
                self._forget(selector, peer, "closed the connection")
                return
            kind, body = decode(data)
        except ProtocolError as exc:
            with self._cond:
                self._detach(peer, "protocol", str(exc))
            return
        except BlockingIOError:  # a spurious wake-up: nothing to read after all
            return
        except OSError as exc:
            self._forget(selector, peer, f"socket error: {exc}")
            return
        with self._cond:
            if peer in self._peers.values():
                peer.last_seen = time.monotonic()
                self._handle(peer, kind, body)

    def _forget(self, selector: selectors.BaseSelector, peer: Peer, reason: str) -> None:
        """Control thread only: drop the peer (if still known), unregister and close its socket."""
        with self._cond:
            self._drop(peer, reason)
        try:
            selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        _drain_and_close(peer.sock)

    def _handle(self, peer: Peer, kind: Msg, body: Any) -> None:
        if kind is Msg.HEARTBEAT:
            return
        if kind is Msg.STATUS:
            self._send(peer, encode(Msg.STATUS, payload=self._status_payload()))
        elif kind is Msg.HELLO and peer.state is PeerState.NEW:
            if body.get("v") != VERSION:
                self._detach(peer, "version", f"protocol version {body.get('v')} is not {VERSION}")
                return
            peer.label = str(body.get("label", ""))[:64]
            peer.state = PeerState.WAITING
            if self._ring is not None:
                self._welcome(peer)
        elif kind is Msg.ATTACH and peer.state in (PeerState.WELCOMED, PeerState.PAUSED):
            self._attach(peer, int(body[0]))
        elif kind is Msg.RELEASE and peer.state in (PeerState.ACTIVE, PeerState.PAUSED):
            peer.held.difference_update(body)
            self._cond.notify_all()
        elif kind is Msg.PAUSE and peer.state is PeerState.ACTIVE:
            peer.state = PeerState.PAUSED
            self._cond.notify_all()
        else:
            self._detach(peer, "protocol", f"unexpected {kind.name} in state {peer.state.value}")

    def _welcome(self, peer: Peer) -> None:
        layout = self._layout
        assert layout is not None and self._ring is not None
        payload = {
            "v": VERSION, "name": self.name, "producer_pid": os.getpid(), "layout": layout.to_json(),
            "slots": self.config.slots, "slot_bytes": layout.slot_bytes,
            "segment_bytes": layout.slot_bytes * self.config.slots, "heartbeat_s": self.config.heartbeat_s,
            "samples_per_epoch": self._samples_per_epoch, "backend": self._ring.backend,
            "handles": self._ring.handles() if hasattr(self._ring, "handles") else None,
        }
        fds = [self._ring.readonly_fd()] if self._ring.backend == "cpu" else []
        try:
            self._send(peer, encode(Msg.WELCOME, payload=payload), fds)
        finally:
            for fd in fds:
                os.close(fd)
        if peer in self._peers.values():
            peer.state = PeerState.WELCOMED

    def _attach(self, peer: Peer, hint: int) -> None:
        """Start ``peer`` at the slowest attached consumer's position (or the oldest batch kept)."""
        active = [p for p in self._peers.values() if p.state is PeerState.ACTIVE and p is not peer]
        start = min((min(p.held) if p.held else self._head) for p in active) if active else self._oldest_valid
        start = max(start, self._oldest_valid)
        if hint >= 0:
            start = max(start, min(hint, self._head))
        peer.state = PeerState.ACTIVE
        self._cond.notify_all()  # a fill thread idling for lack of consumers resumes now
        self._send(peer, encode(Msg.START, start))
        for seq in range(start, self._head):
            batch = self._meta[seq % self.config.slots]
            peer.held.add(seq)
            peer.delivered += 1
            self._send(peer, encode(Msg.BATCH, batch.slot, batch.seq, batch.epoch, batch.offset, batch.size))
            following = self._meta.get((seq + 1) % self.config.slots) if seq + 1 < self._head else None
            done = following.epoch != batch.epoch if following else batch.epoch <= self._last_epoch_done
            if done:
                self._send(peer, encode(Msg.EPOCH_END, batch.epoch, self._epoch_samples[batch.epoch]))

    def _beat(self, now: float) -> None:
        beat = encode(Msg.HEARTBEAT)
        with self._cond:
            for peer in list(self._peers.values()):
                if now - peer.last_seen > self.config.consumer_timeout_s:
                    self._detach(peer, "unresponsive",
                                 f"{peer.describe()} sent nothing for {self.config.consumer_timeout_s:g} s")
                else:
                    self._send(peer, beat)

    def _status_payload(self) -> dict[str, Any]:
        return {"name": self.name, "pid": os.getpid(), "ready": self._layout is not None, "head": self._head,
                "slots": self.config.slots, "batches": self._stats["batches"], "samples": self._stats["samples"],
                "consumers": sum(p.state is not PeerState.NEW for p in self._peers.values()),
                "error": None if self._error is None else repr(self._error)}

    def _send(self, peer: Peer, message: bytes, fds: list[int] | None = None) -> None:
        """Send under the lock; a consumer we cannot reach is dropped (its slots are reclaimed)."""
        if peer not in self._peers.values():
            return
        try:
            send_within(peer.sock, message, SEND_TIMEOUT_S, fds)
        except OSError as exc:  # including TimeoutError: a consumer whose queue stays full is treated as dead
            self._drop(peer, f"unreachable: {exc}")

    def _detach(self, peer: Peer, code: str, reason: str) -> None:
        log.warning("detaching %s from %s: %s", peer.describe(), self.name, reason)
        self._stats["detached"] += 1
        self._send(peer, encode(Msg.DETACH, payload={"reason": reason, "code": code}))
        self._drop(peer, reason)

    def _drop(self, peer: Peer, reason: str) -> None:
        """Forget a peer and reclaim every slot it held; must be called under the lock."""
        fileno = next((k for k, p in self._peers.items() if p is peer), None)
        if fileno is None:
            return
        del self._peers[fileno]
        if peer.held:
            log.info("reclaimed %d slots from %s (%s)", len(peer.held), peer.describe(), reason)
        peer.held.clear()
        try:  # the control thread sees EOF next and closes the socket (see _forget)
            peer.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._cond.notify_all()

    def _shutdown_sockets(self, selector: selectors.BaseSelector) -> None:
        reason = "the producer is shutting down" if self._error is None else f"the producer failed: {self._error!r}"
        with self._cond:
            end = encode(Msg.END, payload={"reason": reason})
            for peer in list(self._peers.values()):
                self._send(peer, end)
                self._drop(peer, "shutdown")
            self._cond.notify_all()
        for key in list(selector.get_map().values()):
            if key.data is not None:
                _drain_and_close(key.fileobj)  # type: ignore[arg-type]
        selector.close()
        self._listener.close()


def _drain_and_close(sock: socket.socket) -> None:
    """Close without a reset: Linux turns unread data at close into ECONNRESET for the peer, which
    could overtake our last message (END/DETACH). After shutdown() the peer can send no more, so
    reading what is queued first makes the close clean."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.setblocking(False)
        while sock.recv(4096):
            pass
    except OSError:
        pass
    sock.close()


def _samples_per_epoch(loader: Any) -> int | None:
    """Samples per epoch of a torch DataLoader when it can be known without iterating."""
    try:
        from torch.utils.data import DataLoader
    except ImportError:  # pragma: no cover - torch is required by the layout anyway
        return None
    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    try:
        return len(loader) * loader.batch_size if loader.drop_last else len(loader.sampler)
    except TypeError:
        return None


@overload
def serve(loader: Iterable[Any], name: str, *, state_dir: str | os.PathLike[str] | None = ...,
          slots: int = ..., stall_timeout_s: float = ..., consumer_timeout_s: float = ...,
          heartbeat_s: float = ..., capacity: int | None = ..., samples_per_epoch: int | None = ...,
          device: str = ..., block: Literal[True] = ...) -> dict[str, Any]: ...
@overload
def serve(loader: Iterable[Any], name: str, *, state_dir: str | os.PathLike[str] | None = ...,
          slots: int = ..., stall_timeout_s: float = ..., consumer_timeout_s: float = ...,
          heartbeat_s: float = ..., capacity: int | None = ..., samples_per_epoch: int | None = ...,
          device: str = ..., block: Literal[False]) -> Producer: ...
def serve(loader: Iterable[Any], name: str, *, state_dir: str | os.PathLike[str] | None = None,
          slots: int = 8, stall_timeout_s: float = 10.0, consumer_timeout_s: float = 5.0,
          heartbeat_s: float = 0.5, capacity: int | None = None, samples_per_epoch: int | None = None,
          device: str = "cpu", block: bool = True) -> Producer | dict[str, Any]:
    """Share ``loader``'s batches under ``name`` with every ``SharedLoader(name)`` on this host.

    Blocks until SIGTERM/SIGINT (or ``stop()`` from another thread) and returns statistics;
    with ``block=False`` it returns the running ``Producer`` instead. The loader is re-iterated
    for each new epoch, so consumers can keep going for as many epochs as they like.
    """
    config = ProducerConfig(slots=slots, heartbeat_s=heartbeat_s, consumer_timeout_s=consumer_timeout_s,
                            stall_timeout_s=stall_timeout_s, capacity=capacity,
                            samples_per_epoch=samples_per_epoch, device=device)
    producer = Producer(loader, name, state_dir=state_dir, config=config)
    if not block:
        return producer.start()
    if threading.current_thread() is not threading.main_thread():
        return producer.run()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(signum: int, _frame: Any) -> None:
        if producer._stop.is_set():  # a second signal: give up on a graceful stop
            raise KeyboardInterrupt
        producer.stop()

    for sig in previous:
        signal.signal(sig, _on_signal)
    try:
        return producer.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
