"""The control protocol: fixed binary messages over an AF_UNIX SOCK_SEQPACKET connection.

Every message is one datagram: a 1-byte type followed by a body that is either a fixed
``struct`` (hot path: BATCH, RELEASE, ...) or UTF-8 JSON (rare: HELLO, WELCOME, DETACH...).
RELEASE is the one variable-length struct: 1 to ``MAX_RELEASE`` sequence numbers, so a consumer
can hand back several slots with one datagram (version 2; version 1 sent one per message).
Nothing received from a peer is ever unpickled; bodies are size-checked and JSON is checked
against the keys each type requires, so a confused or hostile peer yields ``ProtocolError``.
SEQPACKET keeps message boundaries and reports a dead peer as EOF at once, which is what makes
fault detection fast. The ring's memfd travels once, with WELCOME, as SCM_RIGHTS ancillary data.
"""

from __future__ import annotations

import enum
import functools
import json
import select
import socket
import struct
import time
from typing import Any, NamedTuple

from collocate.share.errors import ProtocolError

VERSION = 2
MAX_MESSAGE = 64 * 1024
MAX_RELEASE = 1024  # sequence numbers in one RELEASE (8 KiB body)


class Msg(enum.IntEnum):
    """Message types; C = consumer, P = producer."""

    HELLO = 1  # C→P json {v, pid, label}
    WELCOME = 2  # P→C json {layout, slots, ...} + the ring fd
    ATTACH = 3  # C→P struct: resume hint (-1 = none)
    START = 4  # P→C struct: first sequence number this consumer will get
    BATCH = 5  # P→C struct: slot, seq, epoch, offset, count
    RELEASE = 6  # C→P struct: 1..MAX_RELEASE seqs
    PAUSE = 7  # C→P empty: stop sending batches (detach between epochs / for evaluation)
    HEARTBEAT = 8  # both, empty
    DETACH = 9  # P→C json {reason, code}: you are no longer attached
    STATUS = 10  # C→P empty (probe); P→C json stats
    END = 11  # P→C json {reason}: the producer is shutting down
    EPOCH_END = 12  # P→C struct: loader epoch finished, its sample count


_STRUCTS: dict[Msg, struct.Struct] = {
    Msg.ATTACH: struct.Struct("<q"),
    Msg.START: struct.Struct("<Q"),
    Msg.BATCH: struct.Struct("<IQQQI"),
    Msg.EPOCH_END: struct.Struct("<QQ"),
}
_SEQ = struct.Struct("<Q")
_KINDS = {int(m): m for m in Msg}
_BATCH_HEAD, _BATCH_BODY = int(Msg.BATCH), _STRUCTS[Msg.BATCH]
_RELEASE_HEAD = bytes([int(Msg.RELEASE)])
_EMPTY = {Msg.PAUSE, Msg.HEARTBEAT}
_JSON_KEYS: dict[Msg, tuple[str, ...]] = {
    Msg.HELLO: ("v", "pid"),
    Msg.WELCOME: ("v", "layout", "slots", "slot_bytes", "segment_bytes", "heartbeat_s"),
    Msg.DETACH: ("reason", "code"),
    Msg.END: ("reason",),
}


@functools.lru_cache(maxsize=64)
def _release_struct(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}Q")


class Batch(NamedTuple):
    """A published slot as a consumer sees it: where it is and which samples it holds.

    A named tuple, not a dataclass: one is built per batch on both sides of the hot path."""

    slot: int
    seq: int
    epoch: int
    offset: int
    size: int  # samples in the slot (not `count`: that would hide tuple.count)


def encode(kind: Msg, *fields: Any, payload: dict[str, Any] | None = None) -> bytes:
    """Build one datagram; struct types take ``fields``, JSON types take ``payload``."""
    head = bytes([int(kind)])
    if kind in _STRUCTS:
        return head + _STRUCTS[kind].pack(*fields)
    if kind is Msg.RELEASE:
        return encode_release(fields)
    if kind in _EMPTY or (kind is Msg.STATUS and payload is None):
        return head
    return head + json.dumps(payload or {}, separators=(",", ":")).encode()


def encode_release(seqs: Any) -> bytes:
    """One RELEASE for 1..MAX_RELEASE sequence numbers (callers split longer lists)."""
    n = len(seqs)
    if not 1 <= n <= MAX_RELEASE:
        raise ValueError(f"a RELEASE carries 1..{MAX_RELEASE} sequence numbers, not {n}")
    return _RELEASE_HEAD + _release_struct(n).pack(*seqs)


def decode(data: bytes) -> tuple[Msg, Any]:
    """Parse one datagram into (type, body); raise ``ProtocolError`` on anything malformed."""
    if not data:
        raise ProtocolError("empty message")
    if data[0] == _BATCH_HEAD and len(data) == _BATCH_BODY.size + 1:  # the hot path
        return Msg.BATCH, Batch._make(_BATCH_BODY.unpack_from(data, 1))
    kind = _KINDS.get(data[0])
    if kind is None:
        raise ProtocolError(f"unknown message type {data[0]}")
    body = data[1:]
    if kind is Msg.RELEASE:
        n, rest = divmod(len(body), _SEQ.size)
        if rest or not 1 <= n <= MAX_RELEASE:
            raise ProtocolError(f"RELEASE body has {len(body)} bytes, expected 8 to {8 * MAX_RELEASE} "
                                "in steps of 8")
        return kind, _release_struct(n).unpack(body)
    if kind in _STRUCTS:
        st = _STRUCTS[kind]
        if len(body) != st.size:
            raise ProtocolError(f"{kind.name} body has {len(body)} bytes, expected {st.size}")
        values = st.unpack(body)
        return kind, Batch(*values) if kind is Msg.BATCH else values
    if kind in _EMPTY or (kind is Msg.STATUS and not body):
        if body:
            raise ProtocolError(f"{kind.name} must have an empty body")
        return kind, None
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{kind.name} body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{kind.name} body must be a JSON object")
    missing = [k for k in _JSON_KEYS.get(kind, ()) if k not in obj]
    if missing:
        raise ProtocolError(f"{kind.name} lacks {', '.join(missing)}")
    return kind, obj


def recv_one(sock: socket.socket, *, block: bool = False) -> bytes | None:
    """One datagram, or ``None`` if none is queued (``block``: none came within the socket's
    ``SO_RCVTIMEO``; one syscall either way, no poll first). ``b""``: the peer closed."""
    try:
        data, _, flags, _ = sock.recvmsg(MAX_MESSAGE, 0, 0 if block else socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    if flags & socket.MSG_TRUNC:
        raise ProtocolError("message larger than the protocol allows (truncated)")
    return data


def recv(sock: socket.socket, *, with_fds: bool = False) -> tuple[bytes, list[int]]:
    """Receive one datagram (and any passed fds). ``b""`` means the peer closed the connection."""
    if with_fds:
        data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
    else:
        data, _, flags, _ = sock.recvmsg(MAX_MESSAGE)
        fds = []
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            _close_quietly(fd)
        raise ProtocolError("message larger than the protocol allows (truncated)")
    return data, list(fds)


def send(sock: socket.socket, message: bytes, fds: list[int] | None = None) -> None:
    """Send one datagram, optionally with file descriptors (SCM_RIGHTS)."""
    if fds:
        socket.send_fds(sock, [message], fds)
    else:
        sock.sendall(message)


def send_within(sock: socket.socket, message: bytes, timeout: float, fds: list[int] | None = None) -> None:
    """Send one datagram on a non-blocking socket: a plain ``send`` while the peer's queue has
    room (Python polls before every send on a socket with a timeout; this does not), else wait up
    to ``timeout`` s for room and raise ``TimeoutError`` (an ``OSError``)."""
    deadline = None
    while True:
        try:
            if fds:
                socket.send_fds(sock, [message], fds)
            else:
                sock.send(message)  # SEQPACKET: the whole datagram or an error
            return
        except BlockingIOError:
            now = time.monotonic()
            deadline = deadline or now + timeout
            if now >= deadline:
                raise TimeoutError(f"the peer read nothing for {timeout:g} s") from None
            select.select([], [sock], [], deadline - now)


def _close_quietly(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
