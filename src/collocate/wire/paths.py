"""Where a daemon keeps its state, and the layout inside that directory.

Resolution order: ``--state-dir`` > ``$COLLOCATE_STATE_DIR`` > ``$XDG_STATE_HOME/collocate`` >
``~/.local/state/collocate``. Several daemons can run side by side with different state dirs
(tests and the demo do exactly that). The directory is created with mode 0700 because it holds
the API socket and every job's logs and environment.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from collocate.common.errors import CollocateError
from collocate.node.files import attempt_files as attempt_files

ENV_STATE_DIR = "COLLOCATE_STATE_DIR"
#: The lab's daemon (scripts/lab/collocate-lab.service): clients try its socket before the
#: per-user default, so a shell that did not read /etc/profile.d (ssh host cmd, cron, su -c)
#: still finds it. ``COLLOCATE_LAB_STATE_DIR`` names another (tests).
LAB_STATE_DIR = Path("/var/lib/collocate-lab")
ENV_LAB_STATE_DIR = "COLLOCATE_LAB_STATE_DIR"


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


def lab_state_dir() -> Path | None:
    """The machine's lab daemon's state dir, if the lab set-up made one (a member may not list
    it, but sees that it exists)."""
    path = Path(os.environ.get(ENV_LAB_STATE_DIR) or LAB_STATE_DIR)
    return path if os.path.isdir(path) else None


def client_state_dir(explicit: str | Path | None = None) -> Path:
    """The state dir a client command talks to: ``--state-dir``, ``$COLLOCATE_STATE_DIR``, else
    the lab's daemon when its socket is there, else the per-user default."""
    if explicit or os.environ.get(ENV_STATE_DIR):
        return resolve_state_dir(explicit)
    lab = lab_state_dir()
    if lab is not None and os.path.exists(StateLayout(lab).socket):
        return lab.absolute()
    return resolve_state_dir()


@dataclass(frozen=True, slots=True)
class StateLayout:
    """Every path the daemon writes under its state dir."""

    root: Path

    @property
    def db(self) -> Path:
        return self.root / "collocate.common.sqlite"

    @property
    def socket(self) -> Path:
        return self.root / "collocate.sock"

    @property
    def estimator_socket(self) -> Path:
        """The warm estimator's socket (kept by default, ``estimate/warm.py``)."""
        return self.root / "estimator.sock"

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
        (``jobs/``, the database, the logs) stays private: jobs write only to inherited log
        descriptors, and what group members may read is served through the API. A directory
        someone else could have prepared is refused (``check_ownership``), and files an older
        version left readable are made private.
        """
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_ownership(self.root)
            jobs = self.root / "jobs"
            jobs.mkdir(mode=0o700, exist_ok=True)
            os.chmod(jobs, 0o700, follow_symlinks=False)
            if allow_gid is None:
                os.chmod(self.root, 0o700)
            else:
                os.chown(self.root, -1, allow_gid)
                os.chmod(self.root, 0o710)
            for entry in os.scandir(self.root):
                if entry.path == str(self.dashboard_token):
                    continue  # a secret found readable may have leaked: refused at start, not mended
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mode & 0o077:
                    os.chmod(entry.path, 0o600, follow_symlinks=False)
        except OSError as exc:
            raise CollocateError(
                f"cannot create state directory {self.root}: {exc}",
                hint="pass a writable local directory with --state-dir or COLLOCATE_STATE_DIR",
            ) from exc


def share_with_group(directory: Path, gid: int) -> None:
    """Let ``--group``'s members' jobs use what lives in ``directory`` (the emulated GPUs' state:
    their jobs claim memory there): the directory 2770 and its files 0660, group ``gid``.
    SQLite gives its -wal and -shm files the database file's mode and owner, so they follow."""
    os.chown(directory, -1, gid, follow_symlinks=False)
    os.chmod(directory, 0o2770, follow_symlinks=False)
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False):
            os.chown(entry.path, -1, gid, follow_symlinks=False)
            os.chmod(entry.path, 0o660, follow_symlinks=False)


def check_ownership(root: Path) -> None:
    """Refuse a state dir another user could have planted files or symlinks in.

    The directory must be owned by the daemon's user, be no symlink, and have no symlink in
    it; a group- or world-writable one is made private only while empty (nothing planted yet).
    A root daemon also refuses a path through a directory another user may change (not owned
    by root, or writable by others without the sticky bit): they could swap the state dir.
    """
    st = os.lstat(root)
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _unsafe(root, "it is a symbolic link or not a directory")
    if st.st_uid != euid:
        raise _unsafe(root, f"it is owned by uid {st.st_uid}, not by the daemon's user (uid {euid})")
    entries = list(os.scandir(root))
    if st.st_mode & 0o022 and entries:
        raise _unsafe(root, f"it is writable by others (mode {stat.S_IMODE(st.st_mode):o}) and not empty")
    for entry in entries:
        if entry.is_symlink():
            raise _unsafe(root, f"{entry.name} in it is a symbolic link")
    if euid != 0:
        return
    for parent in root.parents:
        pst = os.stat(parent)
        if pst.st_uid not in (0, euid) or (pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX):
            raise _unsafe(root, f"{parent} may be changed by another user")


def _unsafe(root: Path, why: str) -> CollocateError:
    return CollocateError(f"refusing state directory {root}: {why}",
                          hint="use a directory that only the daemon's user can write, "
                               "e.g. a fresh one created by that user (mode 0700)")
