"""What the dashboard needs from the daemon: the ``DashboardSource`` protocol.

The web app never touches the daemon's store or loop directly; the daemon implements this small
protocol (for instance by forwarding each call to its loop thread, as its socket API does, and
reading samples from ``MonitorStore``). Tests implement it in memory. Every method returns plain
JSON-able dicts, is called from the web server's worker threads, and must be thread-safe.

Shapes (extra keys are passed through to the page untouched):

* ``gpus()``: ``[{"id": "host:0", "uuid", "type", "total_mib", "used_mib", "util": 0-1 or None,
  "jobs": ["3", "5"], "job_mib": {"3": MiB it holds now}, "history": [{"t": epoch s, "util":
  0-1 or None, "used_mib"}, oldest first]}]``;
* ``jobs()``: ``[{"id", "name", "user", "state": "pending|running|done|failed|cancelled|rejected",
  "on": ["host:0"], "mem_mib" (the requirement), "used_mib" (running: what it holds now),
  "submit_time", "start_time", "end_time", "reason" (pending: why it waits)}]``;
* ``job(id)``: the ``jobs()`` row plus ``"argv"``, ``"summary"`` (a ``JobSummary`` dict or None),
  ``"samples"`` (``MonitorStore.job_series`` rows), ``"metrics"`` (``MonitorStore.metrics``) and
  optionally ``"profile"`` (``{"sm_activity", "dram_activity", "source"}``, as ``collocate show``
  gives it); ``None`` when there is no such job;
* ``log_tail(id, max_bytes, stream)``: the end of the job's latest attempt's ``stream``
  ("stdout" or "stderr") as text (a refusal, e.g. another user's job, as text too);
* ``status()``: ``{"tracking": [GuardedSink.status() dicts], "daemon": {"draining": bool, ...}}``.

``submit`` is optional: a source that has it lets the page's form queue a job
(``submit(argv, name=..., mem=...)`` returns the new job id; raise ``InputError`` to refuse).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DashboardSource(Protocol):
    def gpus(self) -> list[dict[str, Any]]: ...

    def jobs(self) -> list[dict[str, Any]]: ...

    def job(self, job_id: str) -> dict[str, Any] | None: ...

    def log_tail(self, job_id: str, max_bytes: int, stream: str = "stdout") -> str: ...

    def status(self) -> dict[str, Any]: ...


def can_submit(source: object) -> bool:
    return callable(getattr(source, "submit", None))
