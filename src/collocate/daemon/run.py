"""Run one daemon in this process: its log file, its signals, open → serve → close.

Kept apart from ``service`` (the loop and its requests) because it is about the process, not
scheduling: ``collocate serve`` calls it; tests and the demo start ``collocate serve`` as a child.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import TextIO

from collocate.daemon.logformat import PrintableLogFormatter
from collocate.daemon.service import ServeConfig, Service, log
from collocate.node.reaping import become_subreaper


def run_daemon(config: ServeConfig, *, on_ready: Callable[[Service], None] | None = None) -> None:
    """Open, serve until SIGTERM/SIGINT, close. Jobs keep running across a daemon stop."""
    os.umask(0o077)  # every state file private to the daemon's user (jobs get their own umask)
    become_subreaper()  # a killed runner's job becomes our child: its exit is not lost
    service = Service(config)
    handler: logging.StreamHandler | None = None
    try:
        service.layout.create(allow_gid=config.allow_gid)
        handler = logging.StreamHandler(open_log(service.layout.daemon_log))
        handler.setFormatter(PrintableLogFormatter())
        handler.setLevel(logging.INFO)
        for logger in (log, *(logging.getLogger(f"collocate.{n}") for n in ("node", "cluster"))):
            logger.addHandler(handler)  # the daemon's, its nodes' and its cluster's events
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
        service.open()
        previous = {s: signal.signal(s, lambda *_: service.stop()) for s in (signal.SIGTERM, signal.SIGINT)}
        if on_ready is not None:
            on_ready(service)
        try:
            service.serve_forever()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
    finally:
        service.close()
        if handler is not None:
            for logger in (log, *(logging.getLogger(f"collocate.{n}") for n in ("node", "cluster"))):
                logger.removeHandler(handler)
            handler.close()
            handler.stream.close()


def open_log(path) -> TextIO:
    """``daemon.log`` for appending: created 0600, never through a planted symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "a", buffering=1)
