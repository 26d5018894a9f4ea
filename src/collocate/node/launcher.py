"""Start a launch plan on this machine: the runner in its own session, its logs opened here.

The head builds each part's ``LaunchPlan`` (``daemon/plan.py``: the exact argv, environment and
cwd, so tests assert on it without starting anything); ``start`` runs it through ``collocate.node.runner`` in a new
session (its own process group), with stdout/stderr going to the attempt's log files; when the
daemon runs as root, the job runs as the user who submitted it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from collocate.node.files import attempt_files
from collocate.node.isolate import CLEAN_ENV, bootstrap_argv, write_command_file, write_env_file

ENV_EMULATED_DIR = "COLLOCATE_EMULATED_DIR"  # the emulated backend's contract with its jobs
ENV_FILE = "env.json"  # the job's environment for the runner; removed once read
#: The job's command for the runner (0600, removed once read): never on the runner's own
#: command line, which every local user reads in ``/proc`` (a ``--db-password=...``).
COMMAND_FILE = "command.json"


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything needed to start one attempt; printable and comparable in tests."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    dir: Path
    uid: int | None  # run as this user (daemon is root and the submitter is someone else)
    gid: int | None
    #: The job's command: the runner reads it from ``COMMAND_FILE`` (``--command-file``), so
    #: no root process shows it. Empty for a plan that carries it in ``argv`` (after ``--``).
    command: tuple[str, ...] = ()


RUNNER_MODULE = "collocate.node.runner"


def with_runner_args(plan: LaunchPlan, *args: str) -> LaunchPlan:
    """The plan with ``args`` given to its runner (what the machine that starts it enforces:
    its cgroup, log bounds, fencing), placed right after the runner's module name."""
    if not args:
        return plan
    at = plan.argv.index(RUNNER_MODULE) + 1
    return replace(plan, argv=(*plan.argv[:at], *args, *plan.argv[at:]))


def start(plan: LaunchPlan) -> tuple[subprocess.Popen, float]:
    """Start the runner; returns its Popen and process start time. Raises OSError on failure.

    The runner runs as the daemon's user, so it can always write its records, isolated
    (``collocate.node.isolate``: ``python -I``, a clean environment, the attempt dir as its
    cwd); it drops to the submitting user (``--uid/--gid``) and only then enters the job's cwd
    and takes the job's environment (from a 0600 file it removes). Log files are opened here
    and inherited, so the job needs no access to the state dir.
    """
    plan.dir.mkdir(parents=True, exist_ok=True)
    files = attempt_files(plan.dir)
    write_private_files(plan)
    with _open_log(files["stdout"]) as out, _open_log(files["stderr"]) as err:
        proc = subprocess.Popen(
            list(plan.argv),
            cwd=plan.dir,
            env=dict(CLEAN_ENV),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # own session and process group: signal the whole job
            close_fds=True,
        )
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        started = 0.0  # exited already; the exit record tells the rest
    return proc, started


def write_private_files(plan: LaunchPlan) -> None:
    """The job's environment and command, in 0600 files of the attempt's folder the runner
    reads (and removes) before it starts the job."""
    write_env_file(plan.dir / ENV_FILE, plan.env)
    if plan.command:
        write_command_file(plan.dir / COMMAND_FILE, plan.command)


def _open_log(path: Path):
    """Append-only, never through a symlink, private to the daemon's user."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab")


def process_matches(pid: int | None, started: float | None, tolerance_s: float = 0.05) -> bool:
    """True when ``pid`` is alive, not a zombie, and is the process that started at ``started``."""
    if not pid or started is None:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(p.create_time() - started) < tolerance_s
    except psutil.Error:
        return False



#: The intermediate process of a detached start, a shell (it starts in a millisecond where a
#: Python takes seconds on a busy node, and the caller waits for it): start the runner in the
#: background in a session of its own (``setsid`` execs it: a background job of a shell without
#: job control is no group leader, so it does not fork again), print its pid, exit. The shell's
#: stdout and stderr are the runner's logs; its stdin is the pipe the pid is read from, written
#: through fd 0 and never passed on (a background job's stdin is /dev/null).
_DETACH = 'setsid "$@" </dev/null & echo $! >&0'


def start_detached(plan: LaunchPlan, node: str) -> tuple[int, float]:
    """Start the runner *double-forked*: nobody's child here, so it outlives the process that
    started it (a cluster node's agent, which Ray's raylet kills with its children). Its
    ``(pid, process start time)``; it is followed by those and its records, never a handle."""
    plan.dir.mkdir(parents=True, exist_ok=True)
    files = attempt_files(plan.dir)
    write_private_files(plan)
    read_end, write_end = os.pipe()
    try:
        with _open_log(files["stdout"]) as out, _open_log(files["stderr"]) as err:
            middle = subprocess.Popen(["/bin/sh", "-c", _DETACH, "sh", *plan.argv],
                                      cwd=plan.dir, env=dict(CLEAN_ENV), stdin=write_end,
                                      stdout=out, stderr=err, start_new_session=True)
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as pipe:
            read_end = -1
            text = pipe.read().decode().strip()
        middle.wait(timeout=60)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    if not text.isdigit():
        raise OSError(f"could not start the runner on node {node} (see {files['stderr']} there)")
    pid = int(text)
    _wait_own_group(pid)
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = 0.0  # exited already; the exit record tells the rest
    return pid, started


def _wait_own_group(pid: int, timeout_s: float = 10.0) -> None:
    """Until the runner leads its process group (``setsid`` ran), so a signal to the group
    right after the start reaches it; or it has exited already."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return
        time.sleep(0.001)


def localize(plan: LaunchPlan, head_root: str, node_root: str,
             emulated_dir: Path | None) -> LaunchPlan:
    """The head's plan as this node runs it: paths under the head's state dir moved to the
    node's root (attempt folder, log and metrics files, MPS directories), this node's runner
    installation, and this node's emulated GPU state (or none). The identity where the head's
    root is the node's (one server)."""

    def move(text: str) -> str:
        if text == node_root or text.startswith(node_root + os.sep):
            return text  # the node's already (a dataset's share dir, under the head's root)
        if text == head_root or text.startswith(head_root + os.sep):
            return node_root + text[len(head_root):]
        return text

    if RUNNER_MODULE not in plan.argv:
        raise ValueError("not a runner's launch plan")
    tail = plan.argv[plan.argv.index(RUNNER_MODULE) + 1:]
    env = {k: move(v) for k, v in plan.env.items()}
    env.pop(ENV_EMULATED_DIR, None)
    if emulated_dir is not None:
        env[ENV_EMULATED_DIR] = str(emulated_dir)
    return replace(plan, argv=(*bootstrap_argv(RUNNER_MODULE), *(move(a) for a in tail)),
                   env=env, dir=Path(move(str(plan.dir))))
