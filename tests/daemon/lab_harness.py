"""A lab for end-to-end tests: real Unix users in a real group, a root daemon serving them.

``lab_members()`` creates (once, idempotently) the group ``collocate-lab`` and three members,
``collocate-m1`` .. ``collocate-m3``, each with a primary group of their own and the lab as a
supplementary group, as on a real server. ``Member.run`` runs the ``collocate`` CLI as that
user in a process of its own (``subprocess``'s ``user``/``group``/``extra_groups``), with a
Python the user may run (``member_python``): the one running the tests, or where that one
lives in a directory members cannot enter (a venv under ``/root``), the system's
``python3`` of the same version with this one's ``sys.path``, as ``docs/lab.md`` tells a lab to
install the daemon where members can read it. Where members cannot enter the venv or the
checkout (a clone in a 0700 home or a ``mktemp -d``), the tests arrange it themselves: the
paths members cannot reach are mirrored, hard-linked where the file system allows, into a
temporary directory they can (``member_paths``), and removed when the tests end. Tests skip,
saying why, when not root.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

GROUP = "collocate-lab"
NAMES = ("collocate-m1", "collocate-m2", "collocate-m3")
HERE = Path(__file__).parent

_REQUEST = (
    "import json, sys\n"
    "from collocate.client.connect import Client\n"
    "from collocate.common.errors import CollocateError\n"
    "client = Client(sys.argv[1], timeout_s=30)\n"
    "out = []\n"
    "for op, args in json.loads(sys.argv[2]):\n"
    "    try:\n"
    "        out.append({'ok': True, 'result': client.request(op, **args)})\n"
    "    except CollocateError as exc:\n"
    "        out.append({'ok': False, 'error': str(exc)})\n"
    "print(json.dumps(out))\n"
)


def why_no_lab() -> str | None:
    if os.getuid() != 0:
        return "needs root: a root daemon, and real member users created with useradd"
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        return "needs useradd and groupadd to create the lab's member users"
    return None


@dataclass(frozen=True)
class Member:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def env(self, **extra: str) -> dict[str, str]:
        python, path = member_python()
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                "PYTHONPATH": path, "USER": self.name, **extra}

    def popen_args(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups),
                "env": self.env(), "cwd": "/tmp"}

    def run(self, state_dir: Path, *args: str, timeout: float = 60, cwd: str = "/tmp",
            **extra_env: str) -> subprocess.CompletedProcess:
        """``collocate ARGS`` as this member (``python -m collocate.daemon``: the daemon's commands)."""
        python, _ = member_python()
        return subprocess.run([python, "-m", "collocate.daemon", args[0], "--state-dir", str(state_dir),
                               *args[1:]], user=self.uid, group=self.gid, extra_groups=list(self.groups),
                              env=self.env(**extra_env), cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def requests(self, state_dir: Path, *ops: tuple[str, dict]) -> list[dict[str, Any]]:
        """API requests as this member over the daemon's socket, in one process: each answer is
        ``{"ok": True, "result": ...}`` or ``{"ok": False, "error": ...}``."""
        python, _ = member_python()
        out = subprocess.run([python, "-c", _REQUEST, str(state_dir), json.dumps(ops)],
                             user=self.uid, group=self.gid, extra_groups=list(self.groups),
                             env=self.env(), cwd="/tmp", capture_output=True, text=True, timeout=60,
                             check=False)
        if out.returncode != 0:
            raise AssertionError(f"request as {self.name} failed: {out.stderr}")
        return json.loads(out.stdout)

    def request(self, state_dir: Path, op: str, **args: Any) -> Any:
        """One request; its result, or raise with the daemon's error."""
        answer = self.requests(state_dir, (op, args))[0]
        if not answer["ok"]:
            raise PermissionError(answer["error"])
        return answer["result"]


def _ensure(name: str) -> Member:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                        "--groups", GROUP, name], check=True, capture_output=True)
        pw = pwd.getpwnam(name)
    lab = grp.getgrnam(GROUP)
    if name not in lab.gr_mem:
        subprocess.run(["usermod", "-a", "-G", GROUP, name], check=True, capture_output=True)
    return Member(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid)))


@cache
def lab_members() -> tuple[Member, ...]:
    subprocess.run(["groupadd", "-f", GROUP], check=True, capture_output=True)
    return tuple(_ensure(name) for name in NAMES)


def _reachable(path: str) -> bool:
    """Whether any user may enter ``path`` and every directory above it (and read ``path``)."""
    p = Path(path).resolve()
    if not os.stat(p).st_mode & 0o005 == 0o005:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in p.parents)


_MIRRORS: list[Path] = []


def _stdlib(path: str) -> bool:
    """Whether ``path`` is this interpreter's standard library: a member's Python has its own,
    and another build's compiled modules would not load in it."""
    base = os.path.realpath(sys.base_prefix)
    real = os.path.realpath(path)
    return real.startswith(base + os.sep) and "site-packages" not in real


def remove_mirrors() -> None:
    """Remove what ``member_paths`` mirrored (``tests/conftest.py`` calls it as pytest ends)."""
    while _MIRRORS:
        shutil.rmtree(_MIRRORS.pop(), ignore_errors=True)


@cache
def member_paths() -> dict[str, str]:
    """Where members find each of this interpreter's import paths and this folder of tests:
    the path itself where they can reach it, else a mirror of it in a temporary directory they
    can (hard links where the file system allows, else copies; directories opened to all)."""
    wanted = [p for p in sys.path if p and os.path.isdir(p) and not _stdlib(p)] + [str(HERE)]
    mirror_root: Path | None = None
    found: dict[str, str] = {}
    for index, path in enumerate(dict.fromkeys(wanted)):
        if _reachable(path):
            found[path] = path
            continue
        if mirror_root is None:
            mirror_root = Path(tempfile.mkdtemp(prefix="collocate-lab-mirror-"))
            os.chmod(mirror_root, 0o755)
            _MIRRORS.append(mirror_root)
        found[path] = mirror(path, mirror_root / str(index))
    return found


def mirror(path: str, target: Path) -> str:
    """``path`` at ``target``, where members can read it: hard links where the file system
    allows, else a copy; every directory opened to all."""
    linked = subprocess.run(["cp", "-al", path, str(target)], capture_output=True, check=False)
    if linked.returncode != 0:  # another file system: copy
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(path, target, symlinks=True)
    for directory, _, _ in os.walk(target):
        os.chmod(directory, os.stat(directory).st_mode | 0o755)
    return str(target)


def job_script() -> str:
    """The emulated training job (``job.py``) at a path members may read."""
    return str(Path(member_paths()[str(HERE)]) / "job.py")


@cache
def member_python() -> tuple[str, str]:
    """(python, PYTHONPATH) that a member can run with collocate importable."""
    paths = member_paths()
    path = os.pathsep.join(paths[p] for p in sys.path if p in paths)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    member = lab_members()[0]
    for python in (sys.executable, shutil.which(version, path="/usr/bin:/bin"),
                   shutil.which("python3", path="/usr/bin:/bin")):
        if python is None:
            continue
        try:
            probe = subprocess.run([python, "-c", "import sys, collocate.client.cli; print(sys.version_info[:2])"],
                                   user=member.uid, group=member.gid, env={"PYTHONPATH": path, "HOME": "/tmp"},
                                   cwd="/tmp", capture_output=True, text=True, timeout=60, check=False)
        except OSError:  # not even executable by the member (a venv under /root)
            continue
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(sys.version_info[:2])):
            return python, path
    raise RuntimeError(f"no Python that {member.name} may run imports collocate "
                       f"(tried {sys.executable} and the system's {version} with {path})")


def work_dir() -> Path:
    """A directory every member may enter and write (their jobs' cwd), removed by the caller."""
    base = Path(tempfile.mkdtemp(prefix="collocate-lab-"))
    os.chmod(base, 0o777)
    return base


def lab_daemon(*args: str, gpus: str = "emulated:2xA100-40GB", period: float = 0.1):
    """A root daemon serving the lab group, in a state dir members can reach (its parent is
    0755: pytest's own temp dirs are private to root). Started; stop it with ``stop_lab``."""
    from daemon_harness import Daemon

    base = Path(tempfile.mkdtemp(prefix="collocate-labd-"))
    os.chmod(base, 0o755)
    return Daemon(base / "state", ["--gpus", gpus, "--period", str(period), "--group", GROUP,
                                   *args]).start()


def stop_lab(d) -> None:
    """Kill the daemon and every job it started (they outlive a killed daemon), remove its dir."""
    d.kill_all()
    shutil.rmtree(d.state_dir.parent, ignore_errors=True)


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def emulated_job(mem_mib: float, seconds: float) -> list[str]:
    """An emulated training job a member may run (claims emulated GPU memory)."""
    python, _ = member_python()
    return [python, job_script(), str(mem_mib), str(seconds)]
