"""Producer-side bookkeeping of one connected consumer (or status probe)."""

from __future__ import annotations

import enum
import socket
import time
from dataclasses import dataclass, field


class PeerState(enum.Enum):
    NEW = "new"  # connected, HELLO not seen yet
    WAITING = "waiting"  # HELLO seen; WELCOME waits for the first batch (ring not built yet)
    WELCOMED = "welcomed"  # has the ring; not attached yet
    ACTIVE = "active"  # attached: receives every batch and must release each one
    PAUSED = "paused"  # between epochs / evaluating: receives nothing, holds only live views


@dataclass(eq=False)
class Peer:
    """One connection. ``held`` is the set of batch sequence numbers this consumer still owns:
    a slot is rewritten only when no peer holds the sequence number stored in it."""

    sock: socket.socket
    pid: int
    held: set[int] = field(default_factory=set)
    state: PeerState = PeerState.NEW
    label: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    delivered: int = 0

    def describe(self) -> str:
        return f"consumer pid {self.pid}" + (f" ({self.label})" if self.label else "")
