"""A ``DashboardSource`` over the daemon's socket API, so the dashboard also runs on its own.

``collocate dashboard`` uses it: the page reads the same ``gpus``/``ls``/``show``/``logs``
requests the CLI makes, plus the monitoring store (``monitor.sqlite``) for a job's summary,
timelines and its own metrics when the daemon writes one. It works unchanged inside the daemon
too (``serve_in_thread`` with a ``Client`` of the daemon's own socket), at the cost of one local
socket round trip per API call.

Submitting from the page queues the job as the user running the dashboard, so it is off unless
asked for (``allow_submit=True``), which ``collocate dashboard`` only allows with a token.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from collocate.monitor.store import MonitorStore

HISTORY_POINTS = 80
HISTORY_WINDOW_S = 120.0


class Requester(Protocol):
    def request(self, op: str, **args: Any) -> Any: ...


class ClientSource:
    def __init__(self, client: Requester, *, store: MonitorStore | None = None,
                 allow_submit: bool = False, cwd: Path | None = None) -> None:
        self.client = client
        self.store = store
        self.cwd = cwd or Path.cwd()
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._held: dict[str, float | None] | None = None  # job id -> MiB it holds, from the last gpus()
        if allow_submit:
            self.submit = self._submit

    def gpus(self) -> list[dict[str, Any]]:
        rows = self.client.request("gpus")
        series: dict[str, list[dict[str, Any]]] = {}
        if self.store is not None:
            for r in self.store.gpu_series(since=time.time() - HISTORY_WINDOW_S):
                util = r["sm"] if r["sm"] is not None else r["gpu_util"]
                series.setdefault(r["uuid"], []).append(
                    {"t": r["t"], "util": util, "used_mib": r["used_mib"]})
        out = []
        now = time.time()
        for g in rows:
            util = g.get("sm_now")
            hist = self._history.setdefault(g["uuid"], deque(maxlen=HISTORY_POINTS))
            hist.append({"t": now, "util": util, "used_mib": g.get("used_mib")})
            out.append({**g, "util": util,
                        "history": series.get(g["uuid"], [])[-HISTORY_POINTS:] or list(hist)})
        self._held = {job: mib for g in rows for job, mib in (g.get("job_mib") or {}).items()}
        return out

    def jobs(self) -> list[dict[str, Any]]:
        """Every job; a running one also gets ``used_mib``: what it holds now on its fullest GPU
        (measured at the last ``gpus()`` call, beside ``mem_mib``, the requirement it declared)."""
        from collocate.daemon.client import list_jobs

        rows = list_jobs(self.client.request, all=True)
        if self._held is None:
            self.gpus()
        for r in rows:
            if r.get("state") == "running":
                r["used_mib"] = (self._held or {}).get(r["id"])
        return rows

    def job(self, job_id: str) -> dict[str, Any] | None:
        from collocate.errors import CollocateError

        try:
            detail = dict(self.client.request("show", id=job_id))
        except CollocateError as exc:  # the daemon's errors arrive as plain CollocateErrors
            if str(exc).startswith("no job"):
                return None
            raise
        attempts = detail.get("attempts") or []
        if attempts:
            detail.setdefault("on", attempts[-1].get("gpus", []))
            detail.setdefault("start_time", attempts[0].get("start"))
        if self.store is not None:
            summary = self.store.job_summary(job_id)
            detail["summary"] = None if summary is None else summary.to_dict()
            detail["samples"] = self.store.job_series(job_id, limit=600)
            detail["metrics"] = self.store.metrics(job_id, limit=600)
        return detail

    def log_tail(self, job_id: str, max_bytes: int, stream: str = "stdout") -> str:
        """The end of the latest attempt's ``stream``; the daemon's refusal (another user's job,
        for a dashboard run by someone else) comes back as the text, to be shown as such."""
        from collocate.errors import CollocateError

        try:
            first = self.client.request("logs", id=job_id, offset=0, stream=stream)
            path = first.get("path")
            try:
                size = os.stat(path).st_size if path else 0
            except OSError:
                size = 0
            if size > max_bytes:
                return str(self.client.request("logs", id=job_id, offset=size - max_bytes,
                                               attempt=first.get("attempt"), stream=stream)["text"])
        except CollocateError as exc:
            return f"({exc})"
        return str(first.get("text", ""))[-max_bytes:] if max_bytes else ""

    def status(self) -> dict[str, Any]:
        ping = self.client.request("ping")
        return {"daemon": ping, "tracking": list(ping.get("tracking", []))}

    def _submit(self, argv: list[str], *, name: str | None, mem: str | None) -> str:
        result = self.client.request(
            "submit", argv=list(argv), gpus=1, mem=mem, name=name, priority=0, retries=None,
            cwd=os.fspath(self.cwd), env=[], base_env=dict(os.environ))
        return str(result["id"])
