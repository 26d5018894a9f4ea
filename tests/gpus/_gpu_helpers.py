"""Helpers shared by the GPU-layer tests (a module name unique across tests/ dirs)."""

from __future__ import annotations

import time
from collections.abc import Callable

from collocate.gpus.emulated import EmulatedBackend

NODE = "testbox"


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def holders(backend: EmulatedBackend, uuid: str) -> dict[int, float]:
    """pid → MiB on one device, as a sample reports it."""
    sample = next(s for s in backend.sample() if s.uuid == uuid)
    return {p.pid: p.used_mib for p in sample.processes}
