"""The wire format of the local API: one JSON object per line, both ways.

Why newline JSON: a client in any language (or ``socat``) can speak it, there is nothing to
unpickle, and a message boundary survives partial reads. Requests are ``{"op": NAME, "args":
{...}}``; replies are ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": MESSAGE,
"hint": HINT}``. On TCP the first line is ``{"token": "..."}`` alone (at most ``MAX_AUTH_BYTES``),
so the daemon reads nothing large from a peer before it knows the peer holds the token. A
``submit`` carries a ``key`` (random, from the client) that makes retrying it safe.

What a peer sends is checked here, before any handler sees it: integers are at most 18 digits
(a 5,000-digit one made ``json`` raise a ``ValueError`` that dropped the connection), ``NaN``
and ``Infinity`` are refused (and ``1e400``, which reads as infinity), and text must be valid Unicode (a lone surrogate in a job's name
was stored, and then every ``ls --all``, ``show``, the dashboard and the usage monitor failed
to encode it). Numbers written as text must be ASCII digits (``"²"`` passes ``str.isdigit``).
Replies are UTF-8; text stored before these checks keeps a lone surrogate as a ``\\ud800``
escape instead of failing the whole reply.
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from typing import Any

from collocate.common.errors import CollocateError, InputError
from collocate.wire import schema
from collocate.wire.rights import RIGHTS

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a submit carries the client's environment; logs are capped
#: A TCP client's first line, ``{"token": "..."}``: read with this limit before anything else.
MAX_AUTH_BYTES = 4096
#: Rows in one ``ls`` reply (``after`` pages on): with names of at most 200 characters and
#: reasons cut at 500 in rows, a page stays far below ``MAX_MESSAGE_BYTES``.
PAGE_ROWS = 500

OPS = tuple(RIGHTS)  # every request the daemon answers, each with its owner rule


class ProtocolError(CollocateError):
    """A malformed or oversized message: the peer is not a collocate client/daemon."""


#: The largest integer a message may carry: job ids, offsets, counts and epoch times fit easily.
MAX_DIGITS = 18
_DIGITS = re.compile(r"[0-9]{1,%d}" % MAX_DIGITS, re.ASCII)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(message: dict[str, Any]) -> bytes:
    # UTF-8, not \\u escapes (an emoji is 4 bytes, not 12); a lone surrogate stored by an older
    # version becomes the JSON escape ``\\ud800`` (raw ones appear only inside JSON strings)
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    data = text.encode("utf-8", "backslashreplace") + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} limit")
    return data


def _bounded_int(text: str) -> int:
    if not _DIGITS.fullmatch(text.lstrip("-")):
        raise ProtocolError(f"a number of {len(text)} characters is over the {MAX_DIGITS}-digit limit")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"{name} is not a number this protocol takes")


def _finite_float(text: str) -> float:
    """``1e400`` is a JSON number Python reads as infinity: refused like ``Infinity``."""
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"the number {text[:40]} is too large for this protocol")
    return value


def decode(line: bytes, *, strict: bool = False) -> dict[str, Any]:
    """One JSON object. ``strict`` (what the daemon reads from peers) also refuses lone
    surrogates anywhere in it; bounded integers and no ``NaN`` hold both ways."""
    try:
        message = json.loads(line, parse_int=_bounded_int, parse_float=_finite_float,
                             parse_constant=_no_constant)
    except ProtocolError:
        raise
    except RecursionError:  # the C decoder's depth guard: a request is never deeply nested
        raise ProtocolError("message nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and whatever else json raises
        raise ProtocolError(f"not a JSON message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    if strict:
        check_text(message)
    return message


def check_text(value: Any, where: str = "the request") -> None:
    """Refuse a lone surrogate in any string (or key) of a decoded message: it is not text, and
    nothing downstream (SQLite, a terminal, the dashboard) can encode it."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            bad = _LONE_SURROGATE.search(item)
            if bad is not None:
                raise InputError(f"{at} holds a lone surrogate (\\u{ord(bad[0]):04x}), which is not text",
                                 hint="send valid Unicode (UTF-8 without unpaired surrogates)")
        elif isinstance(item, dict):
            stack.extend((k, f"a key in {at}") for k in item)
            stack.extend((v, f"field {k!r}" if isinstance(k, str) and not _LONE_SURROGATE.search(k)
                          else at) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, at) for v in item)


def whole_number(value: Any, what: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer given as a JSON number or as ASCII digits (``"12"``; never ``"²"`` or ``"1.5"``),
    within ``[low, high]``; an ``InputError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(f"{what} must be a whole number, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not _DIGITS.fullmatch(text.removeprefix("-")):
            raise InputError(f"{what} must be a whole number, got {value!r}",
                             hint="write it with the digits 0-9, at most 18 of them")
        value = int(text)
    if low is not None and value < low:
        raise InputError(f"{what} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise InputError(f"{what} must be at most {high}, got {value}")
    return value


def read_message(rfile, limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
    """Read one line (at most ``limit`` bytes) from a binary file object; None at a clean end."""
    line = rfile.readline(limit + 1)
    if not line:
        return None
    if len(line) > limit or not line.endswith(b"\n"):
        raise ProtocolError("message too long or truncated")
    return decode(line)


class LateMessage(ProtocolError):
    """A message that began but did not end within its deadline (a peer trickling bytes)."""


class LineReader:
    """Reads messages from a socket under *overall* deadlines, not per-read timeouts: a peer
    that sends one byte every few seconds (each read succeeds) still has to finish a message in
    time. ``read`` waits ``idle_s`` for a message to begin and gives it ``finish_s`` from its
    first byte to end, never past ``deadline`` (a ``time.monotonic`` value, e.g. the token's)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, bytearray()

    def read(self, limit: int, *, idle_s: float, finish_s: float,
             deadline: float | None = None) -> dict[str, Any] | None:
        """One message, or None when the peer closed (or stayed silent past ``idle_s``) before
        sending any of it; ``LateMessage`` or ``ProtocolError`` otherwise."""
        start = time.monotonic()
        ends = start + idle_s if deadline is None else min(start + idle_s, deadline)
        began = bool(self.buffer)
        if began:
            ends = min(ends, start + finish_s)
        while True:
            newline = self.buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self.buffer[:newline + 1])
                del self.buffer[:newline + 1]
                if len(line) > limit:
                    raise ProtocolError("message too long or truncated")
                return decode(line, strict=True)
            if len(self.buffer) > limit:
                raise ProtocolError("message too long or truncated")
            left = ends - time.monotonic()
            if left <= 0:
                if began:
                    raise LateMessage(f"the message did not arrive within {finish_s:g} s")
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(1 << 16, limit + 1 - len(self.buffer)))
            except TimeoutError:
                continue  # the deadline check above decides
            if not chunk:
                if self.buffer:
                    raise ProtocolError("message too long or truncated")
                return None
            if not began:
                began = True
                ends = time.monotonic() + finish_s
                if deadline is not None:
                    ends = min(ends, deadline)
            self.buffer += chunk


def check_logs_args(args: dict[str, Any]) -> dict[str, Any]:
    """A ``logs`` request's offset (a whole number >= 0) and attempt (>= 1, or none), checked
    as input rather than failing inside the read."""
    out = dict(args)
    for key, low, default in (("offset", 0, 0), ("attempt", 1, None)):
        value = args.get(key, default)
        if value is None:
            continue
        try:
            out[key] = whole_number(value, f"logs {key}", low=low, high=1 << 62)
        except InputError as exc:
            raise InputError(exc.args[0], hint="--attempt N counts from 1; offsets are byte "
                                               "positions from 0") from None
    return out


def check_request(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    op, args = message.get("op"), message.get("args", {})
    if op not in OPS:
        raise InputError(f"unknown request {schema.short(op)}", hint=f"valid requests: {', '.join(OPS)}")
    extra = sorted(k for k in message if k not in ("op", "args"))
    if extra:
        raise InputError(f"unknown field {schema.quoted(str(extra[0]))} in the request; known: args, op",
                         hint='a request is {"op": NAME, "args": {...}}')
    if not isinstance(args, dict):
        raise InputError("request args must be a JSON object")
    schema.check(op, args)
    return op, args


def ok(result: Any) -> dict[str, Any]:
    return {"ok": True, "result": result}


def error(exc: BaseException) -> dict[str, Any]:
    hint = getattr(exc, "hint", None)
    return {"ok": False, "error": str(exc.args[0]) if exc.args else type(exc).__name__, "hint": hint}


def call(sock: socket.socket, message: dict[str, Any]) -> Any:
    """Send one request on a connected socket and return its result, raising its error."""
    sock.sendall(encode(message))
    with sock.makefile("rb") as rfile:
        reply = read_message(rfile)
    if reply is None:
        raise ProtocolError("the daemon closed the connection without replying")
    if not reply.get("ok"):
        raise CollocateError(reply.get("error", "request failed"), hint=reply.get("hint"))
    return reply.get("result")
