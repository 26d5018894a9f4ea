"""The wire format of the local API: one JSON object per line, both ways.

Why newline JSON: a client in any language (or ``socat``) can speak it, there is nothing to
unpickle, and a message boundary survives partial reads. Requests are ``{"op": NAME, "args":
{...}}``; replies are ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": MESSAGE,
"hint": HINT}``. On TCP the first line is ``{"token": "..."}`` alone (at most ``MAX_AUTH_BYTES``),
so the daemon reads nothing large from a peer before it knows the peer holds the token. A
``submit`` carries a ``key`` (random, from the client) that makes retrying it safe.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from collocate.daemon.rights import RIGHTS
from collocate.errors import CollocateError, InputError

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a submit carries the client's environment; logs are capped
#: A TCP client's first line, ``{"token": "..."}``: read with this limit before anything else.
MAX_AUTH_BYTES = 4096

OPS = tuple(RIGHTS)  # every request the daemon answers, each with its owner rule


class ProtocolError(CollocateError):
    """A malformed or oversized message: the peer is not a collocate client/daemon."""


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} limit")
    return data


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not a JSON message: {exc}") from exc
    except RecursionError:  # the C decoder's depth guard: a request is never deeply nested
        raise ProtocolError("message nested too deeply") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    return message


def read_message(rfile, limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
    """Read one line (at most ``limit`` bytes) from a binary file object; None at a clean end."""
    line = rfile.readline(limit + 1)
    if not line:
        return None
    if len(line) > limit or not line.endswith(b"\n"):
        raise ProtocolError("message too long or truncated")
    return decode(line)


def check_logs_args(args: dict[str, Any]) -> dict[str, Any]:
    """A ``logs`` request's offset (a whole number >= 0) and attempt (>= 1, or none), checked
    as input rather than failing inside the read."""
    out = dict(args)
    for key, low, default in (("offset", 0, 0), ("attempt", 1, None)):
        value = args.get(key, default)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
            raise InputError(f"logs {key} must be a whole number, got {value!r}",
                             hint="--attempt N counts from 1; offsets are byte positions from 0")
        number = int(value)
        if number < low or number > 1 << 62:
            raise InputError(f"logs {key} must be at least {low}, got {number}")
        out[key] = number
    return out


def check_request(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    op, args = message.get("op"), message.get("args", {})
    if op not in OPS:
        raise InputError(f"unknown request {op!r}", hint=f"valid requests: {', '.join(OPS)}")
    if not isinstance(args, dict):
        raise InputError("request args must be a JSON object")
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
