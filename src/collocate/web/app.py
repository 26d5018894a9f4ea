"""The dashboard's FastAPI app: JSON endpoints, one HTML page, and Prometheus ``/metrics``.

``create_app(source, token=...)`` is the only entry point. Routes:

* ``GET /`` and ``GET /jobs/{id}`` (a job's own, linkable page): the page (``page.PAGE``: inline
  CSS and JS, no build step, no CDN; polls the API);
* ``GET /api/board?page=N&per_page=M&user=&state=&text=``: what the page shows of the jobs
  (``board``: the active ones, one page of the finished ones, counts per state);
* ``GET /api/gpus``, ``/api/jobs``, ``/api/jobs/{id}``, ``/api/status``, and
  ``/api/jobs/{id}/log?stream=stdout|stderr`` (the tail of the latest attempt's output);
* ``GET /api/history?since=SECONDS`` when the source keeps history: per GPU and per user over
  that range (utilisation, used and committed memory, GPUs held, energy);
* ``POST /api/jobs`` when the source can submit: ``{"command": "python a.py --tag 'a b'", "name":
  ..., "mem": "6GiB"}`` (split as a POSIX shell would, ``shlex.split``; unbalanced quotes are
  refused with a 422) or ``{"argv": [...]}``;
* ``POST /api/jobs/{id}/cancel|hold|release`` when the source can act: as the source's user, so
  the daemon's rights decide (a refusal is a 403 with the daemon's words);
* ``GET /metrics``: the Prometheus registry given (``PrometheusSink.registry``), 404 without one.

Access: with ``token`` set, every route needs it, as ``Authorization: Bearer <token>``, header
``X-Collocate-Token``, query ``?token=`` or the cookie a request with the right query token gets
back (so a browser needs the token in the URL once, as with Jupyter; the page then drops it from
the address bar). The cookie is ``HttpOnly`` and ``SameSite=Strict``, and its name is derived
from the token, so dashboards of several daemons on one host (cookies ignore ports) do not
overwrite each other's. Without a token the app must only be served on localhost
(``server.serve_in_thread`` refuses anything else), because the page shows every user's commands
and logs; it then also refuses requests whose ``Host`` is not a loopback name, so a web page
that rebinds its own domain to 127.0.0.1 (DNS rebinding) cannot read it.
"""

from __future__ import annotations

import hashlib
import hmac
import shlex
from typing import Any

from fastapi import Body, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from collocate.common.errors import CollocateError
from collocate.core.model import JobState
from collocate.web.page import PAGE
from collocate.web.source import DashboardSource, can_submit

MAX_LOG_BYTES = 64 * 1024
FINISHED_PER_PAGE = 15  # finished jobs per page: the list stays short at 29 jobs or 2,000
MAX_PER_PAGE = 200


def create_app(source: DashboardSource, *, token: str | None = None,
               registry: Any = None) -> FastAPI:
    """The dashboard over ``source``; ``registry`` is a prometheus_client CollectorRegistry."""
    if token is not None and len(token) < 16:
        raise CollocateError("the dashboard token is too short",
                             hint="use at least 16 random characters, e.g. `openssl rand -hex 16`")
    app = FastAPI(title="collocate", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.token = token
    cookie = "" if token is None else cookie_name(token)  # no token: no cookie is read or set

    @app.middleware("http")
    async def check_token(request: Request, call_next: Any) -> Response:
        if token is None:
            if not _loopback_host(request):
                return JSONResponse({"detail": "this dashboard has no token, so it answers only "
                                     "requests to a loopback address (127.0.0.1, localhost, ::1)"},
                                    status_code=403)
            return await call_next(request)
        via_query = _given(request.query_params.get("token"), token)
        if not (via_query or _given(request.cookies.get(cookie), token) or _header_ok(request, token)):
            return JSONResponse({"detail": "missing or wrong token",
                                 "hint": "open the URL with ?token=... that `collocate "
                                         "dashboard-url` prints, or send 'Authorization: Bearer'"},
                                status_code=401)
        response = await call_next(request)
        if via_query:  # once in the URL, then the browser carries it
            response.set_cookie(cookie, token, httponly=True, samesite="strict", path="/")
        return response

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return PAGE

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(job_id: str) -> str:
        return PAGE  # the script reads the id from the address

    @app.get("/api/gpus")
    def gpus() -> list[dict[str, Any]]:
        return source.gpus()

    @app.get("/api/jobs")
    def jobs() -> list[dict[str, Any]]:
        return source.jobs()

    @app.get("/api/board")
    def board_view(page: int = 0, per_page: int = FINISHED_PER_PAGE, user: str = "",
                   state: str = "", text: str = "") -> dict[str, Any]:
        return board(source.jobs(), page=page, per_page=per_page, user=user, state=state, text=text)

    @app.get("/api/jobs/{job_id}")
    def job(job_id: str) -> dict[str, Any]:
        found = source.job(job_id)
        if found is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return found

    @app.get("/api/jobs/{job_id}/log")
    def log_tail(job_id: str, max_bytes: int = 16 * 1024, stream: str = "stdout") -> dict[str, Any]:
        if stream not in ("stdout", "stderr"):
            raise HTTPException(422, "stream must be stdout or stderr")
        if source.job(job_id) is None:
            raise HTTPException(404, f"no job {job_id!r}")
        size = max(0, min(max_bytes, MAX_LOG_BYTES))
        return {"id": job_id, "stream": stream, "text": source.log_tail(job_id, size, stream)}

    @app.get("/api/status")
    def status() -> dict[str, Any]:
        return {**source.status(), "can_submit": can_submit(source),
                "can_act": callable(getattr(source, "act", None))}

    @app.get("/api/history")
    def history(since: float = 600.0) -> dict[str, Any]:
        keeper = getattr(source, "history", None)
        if not callable(keeper):
            raise HTTPException(501, "this dashboard keeps no history")
        return dict(keeper(since))

    @app.post("/api/jobs/{job_id}/{action}")
    def act(job_id: str, action: str) -> dict[str, Any]:
        actor = getattr(source, "act", None)
        if action not in ("cancel", "hold", "release"):
            raise HTTPException(404, f"no action {action!r}: cancel, hold or release")
        if not callable(actor):
            raise HTTPException(501, "this dashboard is read-only")
        try:
            return dict(actor(action, job_id))
        except CollocateError as exc:
            raise HTTPException(403, str(exc)) from exc

    @app.post("/api/jobs")
    def submit(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        if not can_submit(source):
            raise HTTPException(501, "this dashboard is read-only; use `collocate submit`")
        argv = body.get("argv")
        if isinstance(body.get("command"), str):
            argv = split_command(body["command"])
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise HTTPException(422, "give a command (or argv, a non-empty list of strings)")
        try:
            job_id = source.submit(argv, name=body.get("name") or None,  # type: ignore[attr-defined]
                                   mem=body.get("mem") or None)
        except CollocateError as exc:
            raise HTTPException(422, str(exc)) from exc
        return {"id": job_id}

    @app.get("/metrics")
    def metrics() -> Response:
        if registry is None:
            raise HTTPException(404, "no Prometheus registry configured")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def is_finished(row: dict[str, Any]) -> bool:
    """Whether a job row is in an end state; a state this version does not know (a newer
    daemon's) counts as active, so it is shown with the running jobs rather than lost."""
    try:
        return JobState(str(row.get("state"))).is_terminal
    except ValueError:
        return False


def board(rows: list[dict[str, Any]], *, page: int = 0, per_page: int = FINISHED_PER_PAGE,
          user: str = "", state: str = "", text: str = "") -> dict[str, Any]:
    """The page's view of the jobs: ``active`` (every job not in an end state, filtered),
    one ``page`` of the ``finished`` ones (newest first, ``per_page`` rows), and ``counts`` per
    state over every job (each state of ``JobState`` present, zeros included, and any other
    state the daemon returns)."""
    per_page = max(1, min(per_page, MAX_PER_PAGE))
    text = text.strip().lower()

    def keep(r: dict[str, Any]) -> bool:
        return ((not user or r.get("user") == user) and (not state or r.get("state") == state)
                and (not text or any(text in str(r.get(k) or "").lower()
                                     for k in ("id", "name", "reason"))))

    counts = dict.fromkeys((s.value for s in JobState), 0)
    for r in rows:
        counts[str(r.get("state"))] = counts.get(str(r.get("state")), 0) + 1
    shown = [r for r in rows if keep(r)]
    finished = sorted((r for r in shown if is_finished(r)),
                      key=lambda r: (r.get("end_time") or 0.0, _id_key(r)), reverse=True)
    pages = max(1, -(-len(finished) // per_page))
    page = max(0, min(page, pages - 1))
    return {"active": [r for r in shown if not is_finished(r)],
            "finished": finished[page * per_page:(page + 1) * per_page],
            "finished_total": len(finished), "page": page, "pages": pages, "per_page": per_page,
            "counts": counts}


def _id_key(row: dict[str, Any]) -> tuple[int, str]:
    job_id = str(row.get("id", ""))
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def split_command(command: str) -> list[str]:
    """Split a command line as a POSIX shell would (quotes group words), or refuse it with 422."""
    try:
        return shlex.split(command)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise HTTPException(422, f"cannot split the command: {str(exc).lower()}; close every "
                            "quote, or escape a lone one with a backslash") from None


def cookie_name(token: str) -> str:
    """A per-token cookie name: ports do not scope cookies, several daemons may share a host."""
    return "collocate-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def _given(value: str | None, token: str) -> bool:
    return value is not None and hmac.compare_digest(value.encode(), token.encode())


def _header_ok(request: Request, token: str) -> bool:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and _given(auth[7:].strip(), token):
        return True
    return _given(request.headers.get("x-collocate-token"), token)


def _loopback_host(request: Request) -> bool:
    from collocate.web.server import is_loopback

    host = request.headers.get("host", "")
    name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    return is_loopback(name)
