"""What one node of a Ray cluster runs for the head: a ``LocalNode`` as a Ray actor.

``NodeAgent`` is the node package's ``LocalNode`` with what a cluster node adds: runners started
double-forked (so they outlive the agent and Ray's raylet, which kill their workers' children
when they exit), its state under ``<state dir>/nodes/<name>``, the fence on the agent's
heartbeat, and the check that Ray's session folder of this node is out of other users' reach.
It never imports Ray: ``cluster/ray_head.py`` makes it an actor, and the tests use it in-process.
"""

from __future__ import annotations

from pathlib import Path

from collocate.cluster.exposure import check_session_dir
from collocate.core.model import SharingMode
from collocate.node.confine import NodeBounds
from collocate.node.local import HEARTBEAT, LocalNode

__all__ = ["HEARTBEAT", "NodeAgent"]


class NodeAgent(LocalNode):
    """One node's side of a cluster (see the module docstring)."""

    def __init__(self, *, node: str, root: str, gpus: str, sharing: str = "time-slicing",
                 bounds: NodeBounds | None = None, fence_after_s: float | None = None,
                 session_dir: str | None = None, address: str = "127.0.0.1") -> None:
        if session_dir is not None and Path(session_dir).exists():  # Ray's folder of this node's sockets
            check_session_dir(Path(session_dir))
        super().__init__(node, Path(root), gpus=gpus, sharing=SharingMode(sharing), bounds=bounds,
                         detach=True, fence_after_s=fence_after_s, address=address)

    def ping(self) -> str:
        return self.name

    def hello(self) -> tuple[list, str, str]:
        """What the head asks a new agent once it has started: its GPUs, how it confines jobs,
        and its address."""
        return self.devices(), self.confinement_words(), self.address()
