"""The control protocol: fixed binary messages over an AF_UNIX SOCK_SEQPACKET connection.

Every message is one datagram: a 1-byte type followed by a body that is either a fixed
``struct`` (hot path: BATCH, RELEASE, ...) or UTF-8 JSON (rare: HELLO, WELCOME, DETACH...).
Nothing received from a peer is ever unpickled; bodies are size-checked and JSON is checked
against the keys each type requires, so a confused or hostile peer yields ``ProtocolError``.
SEQPACKET keeps message boundaries and reports a dead peer as EOF at once, which is what makes
fault detection fast. The ring's memfd travels once, with WELCOME, as SCM_RIGHTS ancillary data.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

from collocate.share.errors import ProtocolError

VERSION = 1
MAX_MESSAGE = 64 * 1024


class Msg(enum.IntEnum):
    """Message types; C = consumer, P = producer."""

    HELLO = 1  # C→P json {v, pid, label}
    WELCOME = 2  # P→C json {layout, slots, ...} + the ring fd
    ATTACH = 3  # C→P struct: resume hint (-1 = none)
    START = 4  # P→C struct: first sequence number this consumer will get
    BATCH = 5  # P→C struct: slot, seq, epoch, offset, count
    RELEASE = 6  # C→P struct: seq
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
    Msg.RELEASE: struct.Struct("<Q"),
    Msg.EPOCH_END: struct.Struct("<QQ"),
}
_EMPTY = {Msg.PAUSE, Msg.HEARTBEAT}
_JSON_KEYS: dict[Msg, tuple[str, ...]] = {
    Msg.HELLO: ("v", "pid"),
    Msg.WELCOME: ("v", "layout", "slots", "slot_bytes", "segment_bytes", "heartbeat_s"),
    Msg.DETACH: ("reason", "code"),
    Msg.END: ("reason",),
}


@dataclass(frozen=True)
class Batch:
    """A published slot as a consumer sees it: where it is and which samples it holds."""

    slot: int
    seq: int
    epoch: int
    offset: int
    count: int


def encode(kind: Msg, *fields: Any, payload: dict[str, Any] | None = None) -> bytes:
    """Build one datagram; struct types take ``fields``, JSON types take ``payload``."""
    head = bytes([int(kind)])
    if kind in _STRUCTS:
        return head + _STRUCTS[kind].pack(*fields)
    if kind in _EMPTY or (kind is Msg.STATUS and payload is None):
        return head
    return head + json.dumps(payload or {}, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[Msg, Any]:
    """Parse one datagram into (type, body); raise ``ProtocolError`` on anything malformed."""
    if not data:
        raise ProtocolError("empty message")
    try:
        kind = Msg(data[0])
    except ValueError:
        raise ProtocolError(f"unknown message type {data[0]}") from None
    body = data[1:]
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


def _close_quietly(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
