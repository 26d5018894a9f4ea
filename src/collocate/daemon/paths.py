"""Where a daemon keeps its state, and the layout inside that directory.

Resolution order: ``--state-dir`` > ``$COLLOCATE_STATE_DIR`` > ``$XDG_STATE_HOME/collocate`` >
``~/.local/state/collocate``. Several daemons can run side by side with different state dirs
(tests and the demo do exactly that). The directory is created with mode 0700 because it holds
the API socket and every job's logs and environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from collocate.errors import CollocateError

ENV_STATE_DIR = "COLLOCATE_STATE_DIR"


def resolve_state_dir(explicit: str | Path | None = None) -> Path:
    """The state directory a command should use (not created here)."""
    if explicit:
        return Path(explicit).expanduser().absolute()
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return (base / "collocate").absolute()


@dataclass(frozen=True, slots=True)
class StateLayout:
    """Every path the daemon writes under its state dir."""

    root: Path

    @property
    def db(self) -> Path:
        return self.root / "collocate.sqlite"

    @property
    def socket(self) -> Path:
        return self.root / "collocate.sock"

    @property
    def pid_file(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def dashboard_token(self) -> Path:
        """The dashboard's token (0600), for ``collocate dashboard-url``."""
        return self.root / "dashboard.token"

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.root / "jobs" / job_id / f"attempt-{attempt}"

    def create(self, *, allow_gid: int | None = None) -> None:
        """Make the directory private (0700), or group-traversable (0710) for a shared daemon.

        With ``allow_gid`` (``serve --group``) the group must reach the socket; everything else
        (``jobs/``, the database) stays private: jobs write only to inherited log descriptors.
        """
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            jobs = self.root / "jobs"
            jobs.mkdir(mode=0o700, exist_ok=True)
            os.chmod(jobs, 0o700)
            if allow_gid is None:
                os.chmod(self.root, 0o700)
            else:
                os.chown(self.root, -1, allow_gid)
                os.chmod(self.root, 0o710)
        except OSError as exc:
            raise CollocateError(
                f"cannot create state directory {self.root}: {exc}",
                hint="pass a writable local directory with --state-dir or COLLOCATE_STATE_DIR",
            ) from exc


def attempt_files(directory: Path) -> dict[str, Path]:
    """The files of one attempt: logs, the runner's start record and its exit record."""
    return {
        "stdout": directory / "stdout.log",
        "stderr": directory / "stderr.log",
        "started": directory / "runner.json",
        "exit": directory / "exit.json",
    }
