"""Serve the dashboard from a thread of the daemon, and stop it cleanly.

``serve_in_thread(app, host, port)`` starts a uvicorn server in a daemon thread, waits until it
accepts connections (or fails with the reason, e.g. the port is taken), and returns a
``DashboardServer`` whose ``stop()`` asks uvicorn to finish in-flight requests and joins the
thread. ``port=0`` picks a free port (``server.port`` says which). Serving beyond localhost needs
a token (``create_app(..., token=...)``): the page shows every user's commands and logs.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from collocate.common.errors import CollocateError, address_error

LOCAL_HOSTS = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class DashboardServer:
    host: str
    port: int
    thread: threading.Thread
    server: object  # uvicorn.Server

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let requests in flight finish, join the thread."""
        self.server.should_exit = True  # type: ignore[attr-defined]
        self.thread.join(timeout_s)


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening; a clear error if the port is taken
    (the daemon binds every listener before it serves any)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise address_error((host, port), exc, "--dashboard") from exc
    return sock


def serve_in_thread(app: Callable[..., Awaitable[None]], host: str = "127.0.0.1", port: int = 0, *,
                    start_timeout_s: float = 15.0, sock: socket.socket | None = None) -> DashboardServer:
    """Start serving ``app`` (on ``sock`` if already bound); returns once it accepts connections."""
    import uvicorn

    if not is_loopback(host) and getattr(getattr(app, "state", None), "token", None) is None:
        raise CollocateError(
            f"refusing to serve the dashboard on {host} without a token",
            hint="bind to 127.0.0.1 (and use an SSH tunnel), or set a dashboard token",
        )
    if sock is None:
        sock = bind_listener(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)  # in a non-main thread it leaves signals to the daemon
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="collocate-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise CollocateError(f"the dashboard did not start on {host}:{bound_port}",
                                 hint="see the daemon log for uvicorn's error")
        time.sleep(0.02)
    return DashboardServer(host, bound_port, thread, server)
