"""A ``DashboardSource`` over the daemon's API, so the dashboard also runs on its own.

``collocate dashboard`` uses it, and so does the daemon's own dashboard (through its loop:
``tracking.LoopRequester``): the page reads the same ``gpus``/``ls``/``show``/``logs``
requests the CLI makes, and ``history`` for charts over a chosen range (per GPU and per user,
bucketed by the daemon from its monitoring store). Everything goes through the API, so a
``--group`` member's own dashboard sees what the API lets that member see (their jobs in full,
others' as ``squeue`` shows them) and needs no access to the state dir; cancelling, holding and
releasing from the page are the member's own requests, checked by the daemon.

Submitting from the page queues the job as the user running the dashboard, so it is off unless
asked for (``allow_submit=True``), which ``collocate dashboard`` only allows with a token.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

HISTORY_POINTS = 120
HISTORY_WINDOW_S = 600.0  # the page's default range; it offers up to 24 h
MAX_HISTORY_S = 7 * 86400.0
ACTIONS = ("cancel", "hold", "release")


class Requester(Protocol):
    def request(self, op: str, **args: Any) -> Any: ...


class ClientSource:
    def __init__(self, client: Requester, *, allow_submit: bool = False, cwd: Path | None = None,
                 you: str | None = None) -> None:
        self.client = client
        self.cwd = cwd or Path.cwd()
        self.you = you if you is not None else _me()
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._held: dict[str, float | None] | None = None  # job id -> MiB it holds, from the last gpus()
        if allow_submit:
            self.submit = self._submit

    def gpus(self, since_s: float | None = None) -> list[dict[str, Any]]:
        """Every GPU now, with ``history``: over the last ``since_s`` from the daemon's buckets,
        or (None, as the page polls; it asks ``history`` itself) the points this source saw."""
        rows = self.client.request("gpus")
        series = {} if since_s is None else {g["uuid"]: g["points"] for g in self.history(since_s).get("gpus", [])}
        out = []
        now = time.time()
        for g in rows:
            util = g.get("sm_now")
            hist = self._history.setdefault(g["uuid"], deque(maxlen=HISTORY_POINTS))
            hist.append({"t": now, "util": util, "used_mib": g.get("used_mib"),
                         "committed_mib": g.get("committed_mib")})
            out.append({**g, "util": util, "history": series.get(g["uuid"]) or list(hist)})
        self._held = {job: mib for g in rows for job, mib in (g.get("job_mib") or {}).items()}
        return out

    def history(self, since_s: float = HISTORY_WINDOW_S) -> dict[str, Any]:
        """Per-GPU and per-user usage over the last ``since_s`` seconds (``Api.op_history``)."""
        from collocate.common.errors import CollocateError

        try:
            return dict(self.client.request("history", since_s=min(max(since_s, 60.0), MAX_HISTORY_S),
                                            points=HISTORY_POINTS))
        except CollocateError:  # a daemon of before, without the request
            return {"gpus": [], "users": []}

    def act(self, action: str, job_id: str) -> dict[str, Any]:
        """Cancel, hold or release a job as this source's user (the daemon checks the right)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        return dict(self.client.request(action, id=job_id))

    def jobs(self) -> list[dict[str, Any]]:
        """Every job; a running one also gets ``used_mib``: what it holds now on its fullest GPU
        (measured at the last ``gpus()`` call, beside ``mem_mib``, the requirement it declared)."""
        from collocate.client.connect import list_jobs

        rows = list_jobs(self.client.request, all=True)
        if self._held is None:
            self.gpus()
        for r in rows:
            if r.get("state") == "running":
                r["used_mib"] = (self._held or {}).get(r["id"])
        return rows

    def job(self, job_id: str) -> dict[str, Any] | None:
        from collocate.common.errors import CollocateError

        try:
            detail = dict(self.client.request("show", id=job_id, series=True))
        except CollocateError as exc:  # the daemon's errors arrive as plain CollocateErrors
            if str(exc).startswith("no job"):
                return None
            raise
        attempts = detail.get("attempts") or []
        if attempts:
            detail.setdefault("on", attempts[-1].get("gpus", []))
            detail.setdefault("start_time", attempts[0].get("start"))
        return detail

    def log_tail(self, job_id: str, max_bytes: int, stream: str = "stdout") -> str:
        """The end of the latest attempt's ``stream``; the daemon's refusal (another user's job,
        for a dashboard run by someone else) comes back as the text, to be shown as such."""
        from collocate.common.errors import CollocateError

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
        """The daemon's state, and who this dashboard acts as (``admin``: the daemon's owner,
        who may act on every job)."""
        ping = self.client.request("ping")
        try:
            owner = os.stat(ping.get("state_dir") or "/").st_uid
        except OSError:
            owner = -1
        return {"daemon": ping, "tracking": list(ping.get("tracking", [])), "you": self.you,
                "admin": os.getuid() in (0, owner)}

    def _submit(self, argv: list[str], *, name: str | None, mem: str | None) -> str:
        result = self.client.request(
            "submit", argv=list(argv), gpus=1, mem=mem, name=name, priority=0, retries=None,
            cwd=os.fspath(self.cwd), env=[], base_env=dict(os.environ))
        return str(result["id"])


def _me() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
