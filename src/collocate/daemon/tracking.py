"""The daemon's monitoring: ``UsageMonitor`` (sampler, store, sinks) and the optional dashboard.

``DaemonTracking`` is the only place the daemon's loop touches ``collocate.monitor`` and
``collocate.web``, so ``service.py`` stays about scheduling. Why every call here is wrapped:
monitoring is bookkeeping, scheduling is the daemon's job. The sinks are already behind
``GuardedSink`` (a failing store or MLflow degrades tracking, visible in ``status()``), but the
sampler itself may raise on an unexpected ``/proc`` or a programming error; such an error is
logged (once per kind of call, then at debug level) and the loop carries on placing jobs.

Threads: everything except the dashboard runs on the loop thread. The dashboard's web threads
never touch the daemon's SQLite connections: they go through ``LoopRequester``, which hands each
request to the loop exactly like a socket client does (``Service.call``), monitoring history
included (``history``, ``show`` with ``series``), so the daemon's page and a member's own
``collocate dashboard`` read the same API.

Dashboard access: the page shows every job's command line and logs, so it is never open by
default. The token is stable: the first daemon with a dashboard makes a random one and keeps it
in ``<state>/dashboard.token`` (created 0600, owner only), and every later start reuses it, so
bookmarks and Prometheus scrape configs survive restarts (``collocate dashboard-url`` prints the
URL). It is never the TCP API's token (``--token-file``): a dashboard link shared for a look
must not also submit jobs as the owner; a kept one equal to a TCP token is replaced. Deleting
the file makes a new one at the next start. Only ``--no-dashboard-token`` serves the page without one (and then
only on a loopback address).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collocate.common.errors import CollocateError, InputError
from collocate.wire.paths import StateLayout

log = logging.getLogger("collocate.daemon")


@dataclass(frozen=True)
class TrackingConfig:
    """What ``collocate serve`` asks of monitoring beyond the always-on sampler and store."""

    dashboard: tuple[str, int] | None = None  # (host, port); port 0 picks a free one
    dashboard_token: str | None = None  # from --token-file; None: a random one (or none, below)
    dashboard_auth: bool = True  # False: --no-dashboard-token, no token at all (loopback only)
    mlflow_uri: str | None = None  # "" = the local SQLite store under the state dir


def parse_dashboard(text: str) -> tuple[str, int]:
    """``"8765"`` → ``("127.0.0.1", 8765)``; ``"0.0.0.0:8765"`` → ``("0.0.0.0", 8765)``."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        raise InputError(f"cannot read --dashboard {text!r}",
                         hint="write PORT or HOST:PORT, e.g. --dashboard 8765 or 127.0.0.1:8765")
    return host, int(port)


def check_dashboard(addr: tuple[str, int], auth: bool) -> None:
    """Refuse, before the daemon starts, a dashboard beyond localhost without a token."""
    from collocate.web.server import is_loopback

    if not is_loopback(addr[0]) and not auth:
        raise InputError(f"a dashboard on {addr[0]} cannot go without a token",
                         hint="the page shows every user's commands and logs: keep the token "
                         "(drop the no-token option), or bind to 127.0.0.1 and use an SSH tunnel")


def check_mlflow() -> None:
    """Fail before the daemon starts when ``--mlflow`` is asked for but MLflow is missing."""
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        raise CollocateError("--mlflow needs MLflow, which is not installed",
                             hint="pip install 'collocate[mlflow]' (or run without --mlflow)")


class LoopRequester:
    """Requests from the dashboard's threads, answered by the daemon's loop (``Service.call``)."""

    def __init__(self, call: Callable[[str, dict[str, Any], Any], Any]) -> None:
        from collocate.daemon.server import Peer

        self._call = call
        self._peer = Peer(os.getuid(), os.getgid())  # the daemon's own user: reads everything

    def request(self, op: str, **args: Any) -> Any:
        return self._call(op, args, self._peer)


class DaemonTracking:
    """Monitoring for one daemon; every method is safe to call and never raises into the loop."""

    def __init__(self, state_dir: Path, devices: list, config: TrackingConfig) -> None:
        from collocate.monitor.service import UsageMonitor
        from collocate.monitor.sinks.prometheus import PrometheusSink

        self.config = config
        self.dashboard_server: Any = None
        self._dashboard_socket: Any = None  # bound by ``bind_dashboard``, served by ``start_dashboard``
        self.dashboard_token: str | None = None  # the token in force (given or generated)
        self.token_file = StateLayout(Path(state_dir)).dashboard_token  # 0600: the owner's CLI reads it
        self._failed: set[str] = set()
        sinks: list[Any] = []
        self.prometheus = PrometheusSink(status=self._sink_status)
        sinks.append(self.prometheus)
        if config.mlflow_uri is not None:
            from collocate.monitor.sinks.mlflow_sink import (
                MlflowSink,
                default_tracking_uri,
            )

            uri = config.mlflow_uri or default_tracking_uri(state_dir)
            try:
                sinks.append(MlflowSink(uri))
            except CollocateError:
                raise
            except Exception as exc:  # MLflow refuses the URI itself (unknown scheme...)
                raise CollocateError(f"cannot track in MLflow at {uri}: {exc}",
                                     hint="check --mlflow-uri, or use --mlflow alone for the "
                                     "local store under the state dir") from exc
            log.info("tracking jobs in MLflow at %s", uri)
        self.mon = UsageMonitor(state_dir, devices, sinks=sinks, store_in_background=True)

    def _sink_status(self) -> list[dict[str, Any]]:
        return self.mon.status()["tracking"]

    # -- the loop's calls ---------------------------------------------------------------------
    def tick(self, samples: list, jobs: Mapping[str, Any], trees: Mapping[str, Any] | None = None,
             metrics: Sequence[Any] | None = None, committed: Mapping[str, float] | None = None) -> None:
        """One sampling period, on the samples, process trees and (read on the jobs' nodes)
        metric points the loop already read, and the memory committed on each GPU."""
        self._guard("tick", lambda: self.mon.tick(samples, jobs, trees=trees, metrics=metrics,
                                                  committed=committed))

    def add_devices(self, devices: Sequence[Any]) -> None:
        """GPUs of a node that joined: measured and attributed from now on."""
        self._guard("add_devices", self.mon.sampler.add_devices, devices)

    def job_started(self, info: Any) -> None:
        self._guard("job_started", self.mon.job_started, info)

    def job_ended(self, job_id: str, state: str) -> None:
        self._guard("job_ended", self.mon.job_ended, job_id, state)

    def summary(self, job_id: str) -> dict[str, Any] | None:
        """The job's measured usage for ``collocate show`` (None before its first sample)."""
        s = self._guard("summary", self.mon.store.job_summary, job_id)
        return None if s is None else s.to_dict()

    def job_series(self, job_id: str) -> dict[str, Any]:
        """A job's samples and own metrics, for its charts on the dashboard (served through the
        API, so a member's dashboard needs no access to the monitoring store)."""
        found = self._guard("job_series", self.mon.job_detail, job_id)
        return {k: v for k, v in (found or {}).items() if k != "summary"}

    def history(self, since: float, points: int = 120) -> dict[str, Any]:
        """Per-GPU and per-user usage since ``since`` (``MonitorStore.history``)."""
        import time

        found = self._guard("history", self.mon.store.history, since, time.time(), max(10, min(points, 600)))
        return found or {"since": since, "gpus": [], "users": []}

    def status(self) -> dict[str, Any]:
        return self.mon.status()

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            if what not in self._failed:
                self._failed.add(what)
                log.exception("monitoring (%s) failed; scheduling goes on without it", what)
            else:
                log.debug("monitoring (%s) failed again", what, exc_info=True)
            return None

    # -- dashboard ----------------------------------------------------------------------------
    def bind_dashboard(self) -> None:
        """Bind the dashboard's port now (served later by ``start_dashboard``), so a taken port
        stops the daemon before it serves anything."""
        if self.config.dashboard is not None and self._dashboard_socket is None:
            from collocate.web.server import bind_listener

            self._dashboard_socket = bind_listener(*self.config.dashboard)

    def start_dashboard(self, call: Callable[[str, dict[str, Any], Any], Any], *,
                        avoid: Collection[str] = ()) -> None:
        """Serve the page, its JSON API and ``/metrics`` from a thread; ``call`` is ``Service.call``;
        ``avoid``: tokens the dashboard's must differ from (the TCP API's)."""
        if self.config.dashboard is None:
            return
        from collocate.client.connect import list_jobs
        from collocate.web.app import create_app
        from collocate.web.client_source import ClientSource
        from collocate.web.server import serve_in_thread

        token = None
        if self.config.dashboard_auth:
            token = stable_token(self.token_file, self.config.dashboard_token, avoid=avoid)
        requester = LoopRequester(call)
        source = ClientSource(requester)
        self.prometheus.queue = lambda: list_jobs(requester.request, all=True)
        app = create_app(source, token=token, registry=self.prometheus.registry)
        host, port = self.config.dashboard
        sock, self._dashboard_socket = self._dashboard_socket, None
        self.dashboard_server = serve_in_thread(app, host, port, sock=sock)
        self.dashboard_token = token
        log.info("dashboard on %s (%s; Prometheus metrics at %smetrics)", self.dashboard_server.url,
                 "with a token: `collocate dashboard-url` prints the URL" if token else "no token",
                 self.dashboard_server.url)

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's address, without the token (safe to give any client)."""
        return None if self.dashboard_server is None else self.dashboard_server.url

    def close(self) -> None:
        """Stop the dashboard, then flush and close every sink (never raises)."""
        if self._dashboard_socket is not None:  # bound, never served
            self._dashboard_socket.close()
            self._dashboard_socket = None
        if self.dashboard_server is not None:
            self._guard("dashboard stop", self.dashboard_server.stop)
            self.dashboard_server = None
        self._guard("close", self.mon.close)


def stable_token(path: Path, given: str | None = None, *, avoid: Collection[str] = ()) -> str:
    """The dashboard token: ``given`` if any, else the one ``path`` keeps, else a new random one;
    ``path`` (0600) holds the token in force afterwards, for `collocate dashboard-url`. A kept
    token in ``avoid`` (an older version stored the TCP API's token there) is replaced."""
    stored = None
    try:
        if path.stat().st_mode & 0o077:
            raise CollocateError(f"the dashboard token {path} is readable by other users",
                                 hint=f"chmod 600 {path}, or delete it for a new token")
        stored = path.read_text().strip() or None
    except FileNotFoundError:
        pass
    if stored in avoid:
        stored = None
    token = given or stored or secrets.token_urlsafe(32)
    if token != stored:
        write_private(path, token + "\n")
    return token


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600 from creation, then renamed
    into place, so no reader ever sees a partial or wider-open file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
