"""How the daemon starts code on a user's behalf without letting that user's files run as root.

A root daemon runs each job (and each dataset producer) as the user who submitted it, but the
process that starts it (the runner) stays root so it can always write its records. Anything
that process imports, or that its dynamic loader reads, must therefore come from the daemon's
own installation, never from the job's cwd or environment. So:

* ``bootstrap_argv`` starts a collocate entry point with ``python -I`` (no cwd on ``sys.path``,
  no ``PYTHON*`` variables, no user site-packages) and names the directory the daemon's own
  ``collocate`` package was imported from explicitly;
* ``CLEAN_ENV`` is that process's whole environment (no ``LD_PRELOAD``, ``PYTHONPATH``...);
* the job's environment travels in a private file (``write_env_file``, 0600, removed when read)
  and applies only in the job's own process, after ``exec_as`` dropped privileges, changed to
  the job's cwd *as the user* (so a root-only directory is refused, not revealed) and exec'd.

A job keeps its user's groups (``user_groups``, as ``su``, ``sudo`` and Slurm's jobs do): what
the user may read through a group in their shell (a lab's shared data, the emulated GPUs of a
``--group`` daemon), their jobs may read too, and nothing more.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import collocate

#: The environment of the root-side helper processes (runner, producer launcher).
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
#: The file-creation mask jobs get (the daemon itself runs with 0o077).
JOB_UMASK = 0o022
_PACKAGE_ROOT = str(Path(collocate.__file__).resolve().parent.parent)
_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import runpy; "
         "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def bootstrap_argv(module: str, *args: str) -> list[str]:
    """``python -I`` running ``module`` from the daemon's own collocate installation."""
    return [sys.executable, "-I", "-c", _BOOT, _PACKAGE_ROOT, module, *args]


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """The job's environment, readable by the daemon's user only; never follows a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(env), f)


def read_env_file(path: Path) -> dict[str, str]:
    """Read and remove the environment file (the secrets it holds stay on disk no longer)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        env = json.load(f)
    path.unlink(missing_ok=True)
    return {str(k): str(v) for k, v in env.items()}


def write_command_file(path: Path, argv: Sequence[str]) -> None:
    """A job's command for its runner, as private as its environment: a root process's own
    command line is readable by every local user (``/proc/PID/cmdline``), this file is not."""
    write_env_file(path, {"argv": json.dumps(list(argv))})


def read_command_file(path: Path) -> list[str]:
    """Read and remove what ``write_command_file`` wrote."""
    return [str(a) for a in json.loads(read_env_file(path)["argv"])]


def user_groups(uid: int, gid: int | None) -> list[int]:
    """The groups ``uid`` has at login (``/etc/group`` and NSS), ``gid`` among them; only
    ``gid`` when the user has no name."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return [gid] if gid is not None and gid >= 0 else []
    primary = gid if gid is not None and gid >= 0 else pwd.getpwuid(uid).pw_gid
    return os.getgrouplist(name, primary)


def become(uid: int | None, gid: int | None) -> None:
    """This process takes ``uid``'s groups, then ``gid``, then ``uid`` (nothing when ``uid`` is
    None: the daemon's own user runs its own jobs)."""
    if uid is not None:
        os.setgroups(user_groups(uid, gid))
        if gid is not None and gid >= 0:
            os.setgid(gid)
        os.setuid(uid)


def exec_as(argv: Sequence[str], env: Mapping[str, str], cwd: str, uid: int | None,
            gid: int | None) -> None:
    """In a fresh child: drop to ``uid``/``gid`` (no supplementary groups), enter ``cwd`` as
    that user, and exec ``argv`` with ``env``. Never returns; on failure it says why on stderr
    and exits 127 (the runner records that as the job's exit status)."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE; the job must not
        os.umask(JOB_UMASK)
        become(uid, gid)
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot enter working directory {cwd}: {exc.strerror}") from None
        os.execvpe(argv[0], list(argv), dict(env))
    except BaseException as exc:  # noqa: BLE001 - the child must never return into Python
        why = str(exc)
        if isinstance(exc, FileNotFoundError) and "/" not in argv[0]:  # as a shell says it
            why = "command not found on the job's PATH (yours when you submitted): install it or give its path"
        try:
            os.write(2, f"collocate: cannot start {argv[0]!r}: {why}\n".encode(errors="replace"))
        finally:
            os._exit(127)


def main(argv: list[str] | None = None) -> int:
    """``exec-as`` entry point (dataset producers): ``--uid U --gid G --cwd D --env-file F -- CMD``."""
    import argparse

    parser = argparse.ArgumentParser(prog="collocate.node.isolate")
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--env-file", required=True, type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    exec_as(command, read_env_file(ns.env_file), ns.cwd, ns.uid, ns.gid)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
