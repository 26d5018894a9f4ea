"""The daemon's warm estimator process (on unless ``serve --no-warm-estimator``; why it exists and how it
serves: ``estimate/warm.py``). It starts with the daemon, after the API listens, and stops
with it; it also stops by itself within a second when the daemon dies (it watches its parent)."""

from __future__ import annotations

import subprocess

from collocate.daemon.config import ServeConfig
from collocate.wire.paths import StateLayout

STOP_GRACE_S = 5.0


def start_warm_estimator(layout: StateLayout, config: ServeConfig) -> subprocess.Popen[bytes] | None:
    """Start the warm estimator when the daemon was asked to keep one; its socket appears once
    it is warm (tens of seconds on a busy machine), and until then clients estimate cold."""
    if not config.warm_estimator:
        layout.estimator_socket.unlink(missing_ok=True)  # an earlier run's: clients go cold at once
        return None
    from collocate.estimate.warm import command

    return subprocess.Popen(command(layout.estimator_socket, config.allow_gid), stdin=subprocess.DEVNULL)


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL after ``STOP_GRACE_S``; reaped either way (None: nothing to stop)."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
