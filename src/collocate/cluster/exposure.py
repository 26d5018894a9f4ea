"""Two ways a Ray cluster was open to every local or network user, checked before it is used.

Ray runs code for anyone who can reach it, as the user Ray runs as (root, for agents that run
jobs as their submitters). Issue 31 found two doors:

* **No token.** Started as the docs' commands then said (no ``RAY_AUTH_MODE=token``), a node of
  another user joined the cluster and its task ran as root on the head. ``require_token`` asks
  the cluster for its status *without* a token (a clean environment, an empty home, so no
  ``~/.ray/auth_token`` either): a cluster that answers accepts anyone, and is refused.
* **A session folder others can reach.** Ray makes its temporary folder and each session folder
  (sockets, logs) writable by everyone, without the sticky bit; a local user renamed its sockets,
  a token holder's task timed out and a restarted head hung. ``open_to_others`` says whether any
  folder above the session folder keeps other users out (owned by root or this user, with no
  search permission for group or others, and itself not replaceable): Ray's ``--temp-dir`` must
  be under such a folder.

Neither imports Ray: the head runs the first with Ray's own command line, the agents the second
on each node.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from collocate.common.errors import CollocateError

PROBE_TIMEOUT_S = 60.0


def open_to_others(path: Path) -> str | None:
    """Why other users can reach or replace ``path`` (a Ray session folder), or None when a
    folder above it keeps them out."""
    euid = os.geteuid()
    chain = [path, *path.parents]  # path first, / last
    for depth, folder in enumerate(chain[1:], start=1):
        try:
            st = os.stat(folder)
        except OSError:
            continue
        closed = st.st_uid in (0, euid) and not st.st_mode & 0o011
        if closed and _fixed(chain[depth + 1:], euid):
            return None
    return (f"no folder above {path} keeps other users out, and Ray makes its session folders "
            "writable by everyone: a local user can rename its sockets")


def _fixed(above: list[Path], euid: int) -> bool:
    """Whether nobody else can rename or replace what lies under these folders."""
    for folder in above:
        st = os.stat(folder)
        if st.st_uid not in (0, euid) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            return False
    return True


def check_session_dir(path: Path) -> None:
    """Refuse a Ray session folder that other users can reach (``open_to_others``)."""
    why = open_to_others(path)
    if why is not None:
        raise CollocateError(
            f"Ray's session folder is open to other users: {why}",
            hint="start Ray on every node with --temp-dir under a folder only root (or Ray's user) "
                 "can enter, e.g. `install -d -m 700 /var/lib/collocate-ray` and `ray start ... "
                 "--temp-dir /var/lib/collocate-ray/tmp` (docs/multi-node.md)")


def require_token(address: str) -> None:
    """Refuse a cluster that answers a client without a token (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    with tempfile.TemporaryDirectory(prefix="collocate-ray-probe-") as home:
        env["HOME"] = home
        try:
            out = subprocess.run(
                [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "status",
                 "--address", address], env=env, cwd=home, capture_output=True, text=True,
                timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise CollocateError(
                f"could not check within {PROBE_TIMEOUT_S:.0f} s that the Ray cluster at {address} "
                "refuses clients without a token", hint="check the cluster answers (`ray status`)") from None
    if out.returncode == 0:
        raise CollocateError(
            f"the Ray cluster at {address} answers clients without a token: anyone who reaches it "
            "can run code as the user Ray runs as (root, for jobs run as their submitters)",
            hint="start every node with RAY_AUTH_MODE=token and the cluster's token "
                 "(RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH), and collocate serve with the same "
                 "(docs/multi-node.md)")
