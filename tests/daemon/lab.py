"""A lab for the end-to-end tests of issue 31: a root daemon serving ``--group nogroup``, two
members (A = ``collocate-a``, B = ``nobody``) and a local user outside the group (E =
``collocate-e``), all real Unix users, talking to the daemon from processes of their own.

The test interpreter may live where other users cannot read (a Python under ``/root``), so a
user's process starts as root, imports what it needs, then drops to the user (no supplementary
groups) before it touches the daemon: from then on the kernel sees that user only.
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
from pathlib import Path
from typing import Any

import pytest

NOGROUP = "nogroup"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def ensure_user(name: str, group: str | None) -> User:
    """The user ``name`` (created once, no home, no login shell), in ``group`` or its own."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        args = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        args += ["--gid", group] if group else ["--user-group"]
        out = subprocess.run([*args, name], capture_output=True, text=True, check=False)
        if out.returncode not in (0, 9):  # 9: it exists (another test made it meanwhile)
            pytest.skip(f"cannot create user {name}: {out.stderr.strip()}")
        pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid)


def lab_users() -> dict[str, User]:
    """A and B in ``nogroup`` (the daemon's group), E outside it; skipped where that cannot be."""
    if os.getuid() != 0:
        pytest.skip("needs root: a root daemon, and users to become")
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd to create the lab's users")
    try:
        nogroup = grp.getgrnam(NOGROUP).gr_gid
    except KeyError:
        pytest.skip("needs the nogroup group")
    nobody = pwd.getpwnam("nobody")
    users = {"A": ensure_user("collocate-a", NOGROUP), "B": User("nobody", nobody.pw_uid, nogroup),
             "E": ensure_user("collocate-e", None)}
    assert users["E"].gid != nogroup
    return users


_PRELUDE = (  # what the user's code and the CLI import, imported while still root
    "import contextvars, fnmatch, json, os, pwd, socket, sys, time, uuid\n"
    "import rich.console, rich.live, rich.table, rich.text\n"
    "import collocate.daemon.__main__, collocate.client.connect, collocate.client.follow\n"
    "import collocate.wire.protocol, collocate.client.render, collocate.client.select\n"
    "import collocate.wire.spec, collocate.client.sweep, collocate.estimate.providers\n"
    "import collocate.monitor.report, collocate.common.tls, encodings.idna, psutil\n"
    "os.setgroups([]); os.setgid({gid}); os.setuid({uid})\n"
)


def _python() -> tuple[list[str], dict[str, str]]:
    """The interpreter and environment a user's process starts with: the one members may run,
    with import paths they can reach (``lab_harness.member_python``), so that whatever the code
    imports after it dropped to the user (the CLI's commands load lazily) is still readable."""
    sys.path.insert(0, str(Path(__file__).parent))
    from lab_harness import member_python

    python, path = member_python()
    return [python], {**os.environ, "PYTHONPATH": path}


def run_as(user: User, code: str, *args: str, cwd: str = "/", timeout: float = 120,
           check: bool = True) -> subprocess.CompletedProcess:
    """Run Python ``code`` as ``user`` (see the module docstring); ``sys.argv[1:]`` is ``args``."""
    python, env = _python()
    out = subprocess.run([*python, "-c", _PRELUDE.format(uid=user.uid, gid=user.gid) + code,
                          *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                         check=False, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"as {user.name}: exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def popen_as(user: User, code: str, *args: str) -> subprocess.Popen:
    """``run_as`` in the background; its stdout is a text pipe."""
    python, env = _python()
    return subprocess.Popen([*python, "-c", _PRELUDE.format(uid=user.uid, gid=user.gid) + code,
                             *args], stdout=subprocess.PIPE, text=True, env=env)


_RAW = """
replies = []
for line in sys.stdin.buffer.read().split(b"\\n"):
    if not line:
        continue
    started = time.monotonic()
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.sendall(line + b"\\n")
    reply = s.makefile("rb").readline()
    s.close()
    replies.append({"reply": reply.decode(errors="replace"), "s": time.monotonic() - started})
print(json.dumps(replies))
"""


def raw_requests(user: User, socket_path: Path, lines: list[bytes]) -> list[dict[str, Any]]:
    """Send each line (a request, as bytes) on a connection of its own, as ``user``; each
    reply decoded (``{"ok": False, "error": "no reply"}`` for none) with its ``s`` (seconds)."""
    python, env = _python()
    out = subprocess.run([*python, "-c", _PRELUDE.format(uid=user.uid, gid=user.gid) + _RAW,
                          str(socket_path)], input=b"\n".join(lines) + b"\n", capture_output=True,
                         timeout=600, check=True, env=env)
    replies = []
    for r in json.loads(out.stdout):
        reply = json.loads(r["reply"]) if r["reply"].strip() else {"ok": False, "error": "no reply"}
        replies.append({**reply, "s": r["s"]})
    return replies


def submit_as(user: User, socket_path: Path, **args: Any) -> dict[str, Any]:
    line = json.dumps({"op": "submit", "args": {"mem": "1GiB", **args}}).encode()
    return raw_requests(user, socket_path, [line])[0]


def cli_as(user: User, state_dir: Path, *argv: str, cwd: str = "/",
           timeout: float = 120) -> subprocess.CompletedProcess:
    """``collocate ARGV --state-dir STATE`` as ``user`` (the real CLI, in a process of theirs)."""
    code = ("import runpy\nsys.argv = ['collocate', *sys.argv[1:]]\n"
            "runpy.run_module('collocate.daemon', run_name='__main__')\n")
    return run_as(user, code, *argv, "--state-dir", str(state_dir), cwd=cwd, timeout=timeout,
                  check=False)


class LabDir:
    """A directory members can reach (0755, root-owned parents), optionally on its own tmpfs,
    with a ``work`` folder anyone may write (the members' jobs' cwd)."""

    def __init__(self, disk_mib: int | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="collocate-lab-"))
        os.chmod(self.base, 0o755)
        self.mounted = False
        root = self.base / "disk"
        root.mkdir()
        if disk_mib is not None:
            mount = ["mount", "-t", "tmpfs", "-o", f"size={disk_mib}m,mode=0755", "tmpfs", str(root)]
            if subprocess.run(mount, check=False).returncode:
                self.close()
                pytest.skip("cannot mount a tmpfs here")
            self.mounted = True
        self.state = root / "state"
        self.work = self.base / "work"
        self.work.mkdir()
        os.chmod(self.work, 0o777)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.base / "disk")], check=False)
        shutil.rmtree(self.base, ignore_errors=True)
