"""Shared fixtures: real daemon processes on emulated GPUs, in temp state dirs, always cleaned up.

``daemons`` starts ``collocate serve`` subprocesses with a short period; at teardown every
daemon is SIGKILLed and every job process group it launched (found from the runners' own
records, since jobs outlive a killed daemon on purpose) is killed too, and so is every
shared-dataset producer still serving. The helpers live in ``daemon_harness``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_harness import JOB, START_TIMEOUT_S, Daemon, job_argv, wait_for  # noqa: F401 - re-exported


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def make(*args: str, name: str = "state", gpus: str = "emulated:2xA100-40GB",
             period: float = 0.1) -> Daemon:
        # time-slicing unless a test asks: the default (auto) is MPS on emulated GPUs
        sharing = [] if "--sharing" in args else ["--sharing", "time-slicing"]
        d = Daemon(tmp_path / name, ["--gpus", gpus, "--period", str(period), *sharing, *args])
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.kill_all()


@pytest.fixture
def lab():
    """The lab of ``lab.py``: members A and B of ``nogroup``, E outside it (skipped without root)."""
    from lab import lab_users

    return lab_users()


@pytest.fixture
def lab_daemon(daemons):
    """``make(*serve_args, disk_mib=None)``: a root daemon for ``--group nogroup`` in a
    ``LabDir``; its jobs and dirs are gone after the test."""
    from lab import LabDir

    made: list = []

    def make(*args: str, disk_mib: int | None = None) -> tuple[Daemon, Path]:
        where = LabDir(disk_mib)
        d = daemons("--group", "nogroup", *args, name=str(where.state))
        made.append((d, where))
        return d, where.work

    yield make
    for d, where in made:
        d.kill_all()
        where.close()
