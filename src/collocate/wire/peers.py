"""Who is at the other end of a local socket, and whether they may use a daemon: one rule for the
daemon's API (``daemon/server.py``) and for the warm estimator it starts (``estimate/warm.py``),
which admits exactly the users the daemon does."""

from __future__ import annotations

import grp
import pwd
import socket
import struct
from dataclasses import dataclass

from collocate.common.errors import CollocateError


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




def peer_of(sock: socket.socket) -> Peer:
    """The peer of a Unix socket, from the kernel (``SO_PEERCRED``): it cannot lie about itself."""
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
        hint="ask its owner (on a lab server: the lab's admin) to add you to the group it "
        "serves (--group)",
    )
