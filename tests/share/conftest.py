"""Fixtures: spawned real processes, always reaped, and a per-test producer namespace."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if not sys.platform.startswith("linux"):
    pytest.skip("shared loading needs Linux", allow_module_level=True)

# forkserver with torch preloaded: workers start in milliseconds instead of re-importing torch
# (seconds each on a busy 2-core CI box), and still never inherit pytest's threads or sockets.
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["torch", "_share_workers", "collocate.share.consumer", "collocate.share.producer"])

from _share_workers import Sender  # a module children can import by name, unlike conftest


class Procs:
    """Starts spawn processes and kills whatever is left at the end of the test."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.receivers: list[Any] = []
        self.buffered: dict[str, list[tuple[Any, ...]]] = {}

    @property
    def queue(self) -> Sender:
        """A fresh pipe for one worker; ``get`` reads from all of them."""
        recv_end, send_end = CTX.Pipe(duplex=False)
        self.receivers.append(recv_end)
        return Sender(send_end)

    def start(self, target: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
        proc = CTX.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        proc.start()
        self.started.append(proc)
        return proc

    def get(self, timeout: float = 30.0) -> tuple[Any, ...]:
        import time
        from multiprocessing.connection import wait

        deadline = time.monotonic() + timeout
        while self.receivers and time.monotonic() < deadline:
            for conn in wait(self.receivers, timeout=max(0.0, deadline - time.monotonic())):
                try:
                    return conn.recv()
                except EOFError:  # that worker exited; its messages were all read
                    self.receivers.remove(conn)
        pytest.fail(f"no message from a worker within {timeout} s")

    def collect(self, tags: list[str], timeout: float = 60.0) -> dict[str, list[tuple[Any, ...]]]:
        """Messages per tag until every tag reported "done" or "error"."""
        import time

        out = self.buffered
        for t in tags:
            out.setdefault(t, [])
        deadline = time.monotonic() + timeout
        while any(not out[t] or out[t][-1][0] not in ("done", "error") for t in tags):
            msg = self.get(max(0.1, deadline - time.monotonic()))
            out.setdefault(msg[0], []).append(msg[1:])
        return {t: out.pop(t) for t in tags}

    def ready(self, *tags: str, timeout: float = 30.0) -> None:
        """Wait until each tagged worker has built its loader (other messages are kept)."""
        import time

        deadline = time.monotonic() + timeout
        while not all(any(m[0] in ("ready", "error") for m in self.buffered.get(t, [])) for t in tags):
            msg = self.get(max(0.1, deadline - time.monotonic()))
            self.buffered.setdefault(msg[0], []).append(msg[1:])
        for t in tags:
            first = next(m for m in self.buffered[t] if m[0] in ("ready", "error"))
            assert first[0] == "ready", f"worker {t} failed: {first}"

    def reap(self) -> None:
        for proc in self.started:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.join(5)


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.reap()


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")
