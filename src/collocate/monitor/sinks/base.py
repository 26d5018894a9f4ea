"""The ``Sink`` protocol and ``GuardedSink``: a failing sink never stops scheduling.

A sink receives what the sampler produced (``write``) and job lifecycle events. Real sinks
(MLflow, a remote tracking server, a full disk) fail; the daemon's loop must not. ``GuardedSink``
wraps any sink: calls queue in order, a failure is logged once (with what to do), the sink is
marked ``degraded`` with the reason, and the queued calls are retried with exponential backoff
(1 s, 2 s, 4 s, ... capped at ``max_backoff_s``). The queue is bounded: when a sink stays down,
the oldest calls are dropped and counted, so memory stays flat. ``status()`` is what
``collocate gpus`` and the dashboard show.

``background=True`` delivers from a worker thread instead of the caller's: for sinks whose calls
can take long (MLflow creating its database, a slow tracking server), so the daemon's loop only
appends to the queue. The Prometheus sink is fast and stays synchronous; the daemon writes its
monitoring store from a worker too (a cluster's tick is thousands of rows: tens of ms of the
round's time at 800 GPUs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from collocate.monitor.sampler import Tick

log = logging.getLogger("collocate.monitor")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What a sink knows about a job when it starts (MLflow turns these into params and tags)."""

    job_id: str
    name: str = ""
    user: str = ""
    argv: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    sharing: str = ""
    policy: str = ""
    neighbours: tuple[str, ...] = ()  # jobs already on its GPUs when it started
    extra: dict[str, str] = field(default_factory=dict)


class Sink(Protocol):
    name: str

    def job_started(self, job: JobInfo) -> None: ...

    def write(self, tick: Tick) -> None: ...

    def job_ended(self, job_id: str, status: str) -> None:
        """``status``: a ``JobState`` value (done, failed, cancelled...)."""
        ...

    def close(self) -> None: ...


class GuardedSink:
    """Wraps a sink so its failures degrade tracking instead of raising (module docstring)."""

    def __init__(self, sink: Sink, *, base_backoff_s: float = 1.0, max_backoff_s: float = 300.0,
                 max_pending: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 background: bool = False) -> None:
        if base_backoff_s <= 0 or max_backoff_s < base_backoff_s or max_pending < 1:
            raise ValueError("need 0 < base_backoff_s <= max_backoff_s and max_pending >= 1")
        self.sink = sink
        self.name = getattr(sink, "name", type(sink).__name__)
        self.base_backoff_s, self.max_backoff_s = base_backoff_s, max_backoff_s
        self.clock = clock
        self._pending: deque[tuple[str, tuple[Any, ...]]] = deque(maxlen=max_pending)
        self.degraded = False
        self.reason: str | None = None
        self.failures = 0  # consecutive failed tries
        self.dropped = 0
        self._next_try = float("-inf")
        self._lock = threading.Lock()  # guards the queue; delivery happens outside it
        self._deliver = threading.Lock()  # one delivery at a time (worker, close, flush)
        self._wake = threading.Event()
        self._closing = False
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(target=self._run, name=f"sink-{self.name}",
                                            daemon=True)
            self._worker.start()

    # the Sink interface: queue, then try to flush
    def job_started(self, job: JobInfo) -> None:
        self._call("job_started", job)

    def write(self, tick: Tick) -> None:
        self._call("write", tick)

    def job_ended(self, job_id: str, status: str) -> None:
        self._call("job_ended", job_id, status)

    def close(self, timeout_s: float = 30.0) -> None:
        """One last flush attempt (ignoring the backoff), then close the sink; never raises."""
        self._closing = True
        if self._worker is not None:
            self._wake.set()
            self._worker.join(timeout_s)
        self._next_try = float("-inf")
        if self._deliver.acquire(timeout=timeout_s):
            try:
                self._flush()
            finally:
                self._deliver.release()
        else:
            log.warning("tracking sink %s is stuck; %d call(s) not delivered", self.name,
                        len(self._pending))
            return
        try:
            self.sink.close()
        except Exception as exc:
            log.warning("tracking sink %s did not close cleanly: %s", self.name, exc)

    def status(self) -> dict[str, Any]:
        return {"sink": self.name, "degraded": self.degraded, "reason": self.reason,
                "pending": len(self._pending), "dropped": self.dropped,
                "retry_in_s": max(0.0, self._next_try - self.clock()) if self.degraded else 0.0}

    def _call(self, method: str, *args: Any) -> None:
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1  # deque(maxlen) drops the oldest on append
            self._pending.append((method, args))
        if self._worker is not None:
            self._wake.set()
        else:
            self.flush()

    def _run(self) -> None:
        """The worker: deliver whenever woken, and retry when the backoff has passed."""
        while not self._closing:
            wait = self._next_try - self.clock() if self.degraded else 1.0
            self._wake.wait(timeout=max(0.05, min(1.0, wait)))
            self._wake.clear()
            if not self._closing:
                self.flush()

    def flush(self) -> None:
        """Deliver queued calls in order until one fails (then back off) or none are left."""
        with self._deliver:
            self._flush()

    def _flush(self) -> None:
        if self.clock() < self._next_try:
            return
        while True:
            with self._lock:
                if not self._pending:
                    break
                method, args = self._pending[0]
            try:
                getattr(self.sink, method)(*args)
            except Exception as exc:
                self._failed(exc)
                return
            with self._lock:
                if self._pending and self._pending[0][1] is args:  # not dropped meanwhile
                    self._pending.popleft()
        if self.degraded:
            log.warning("tracking sink %s recovered after %d failed tries", self.name,
                        self.failures)
        self.degraded, self.reason, self.failures = False, None, 0

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        delay = min(self.max_backoff_s, self.base_backoff_s * 2 ** (self.failures - 1))
        self._next_try = self.clock() + delay
        reason = f"{type(exc).__name__}: {exc}"
        if not self.degraded:
            log.warning("tracking sink %s failed (%s); scheduling goes on, tracking is degraded "
                        "and retried with backoff. Check the tracking URI / free disk space.",
                        self.name, reason)
        self.degraded, self.reason = True, reason


class SinkSet:
    """Several guarded sinks behind one call each: what the daemon holds."""

    def __init__(self, sinks: Sequence[Sink], **guard: Any) -> None:
        """Wrap each sink in ``GuardedSink``; one with ``background = True`` gets a worker."""
        self.sinks = [
            s if isinstance(s, GuardedSink)
            else GuardedSink(s, background=bool(getattr(s, "background", False)), **guard)
            for s in sinks
        ]

    def job_started(self, job: JobInfo) -> None:
        for s in self.sinks:
            s.job_started(job)

    def write(self, tick: Tick) -> None:
        for s in self.sinks:
            s.write(tick)

    def job_ended(self, job_id: str, status: str) -> None:
        for s in self.sinks:
            s.job_ended(job_id, status)

    def close(self) -> None:
        for s in self.sinks:
            s.close()

    def status(self) -> list[dict[str, Any]]:
        return [s.status() for s in self.sinks]

    @property
    def degraded(self) -> bool:
        return any(s.degraded for s in self.sinks)
