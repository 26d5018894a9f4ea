"""The small wrapper process each job runs under (``collocate.node.runner``, started isolated).

Why a wrapper: the daemon may be killed (even with SIGKILL) while jobs run. The runner, not the
daemon, is the job's parent: it starts the command in its own session (so the whole job is one
process group the daemon can signal), waits for it, and writes the exit status, end time and
stderr tail to ``exit.json`` atomically. A restarted daemon re-adopts a live runner (pid and
process start time, recorded in ``runner.json`` and in SQLite) or reads the exit record of a job
that ended while it was down. Nothing about the job is lost with the daemon's memory.

The runner itself may be killed too, so its records are ordered to leave no gap: the job
starts only once ``child.json`` names it (so a job that ran is never taken for one that did
not), and its status is read with ``WNOWAIT`` and written to ``exit.json`` *before* the job is
reaped (a runner killed in between leaves the job's zombie to the daemon, its subreaper:
``collocate.node.reaping``). A full disk delays the record, never loses it.

Isolation (``collocate.node.isolate``): a root daemon starts the runner with ``python -I``
and a clean environment; the job's environment and its command are read from private files
(0600, removed once read: a root process's own command line is every local user's to read in
``/proc``, so no job's command is ever on it), and the job drops privileges before it enters its
cwd and execs. A ``--notify`` command runs through the runner too, with ``--stdin-file`` (its
summary) and ``--time-limit`` (its whole tree stopped then).

The runner survives SIGTERM/SIGINT/SIGHUP itself: a cancel signals the whole process group, the
job gets the signal, and the runner records how it ended. A signal that arrives before the job
has started is passed on to it (or the job is not started at all).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from collocate.node.fence import with_fence_path
from collocate.node.isolate import exec_as, read_command_file, read_env_file
from collocate.node.jobtree import JobTree

TAIL_BYTES = 16 * 1024  # how much of stderr is kept with an attempt and inspected for OOM


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_record_until_written(path: Path, data: dict, *, retry_s: float = 1.0) -> None:
    """Write the exit record, waiting out a full disk (ENOSPC) rather than losing it: the job's
    zombie is kept until then, so its status is never lost, and the daemon sees the job as
    running until the record is there. Without the stderr tail if only a smaller file fits."""
    smaller = {k: v for k, v in data.items() if k != "stderr_tail"}
    while True:
        for record in (data, smaller):
            try:
                write_json_atomic(path, record)
                return
            except OSError as exc:
                error = exc
        if not path.parent.is_dir():  # the attempt's folder was removed: no one can read it
            return
        try:
            print(f"collocate: cannot write {path.name} ({error}); retrying", file=sys.stderr, flush=True)
        except OSError:
            pass  # stderr is on the same full disk
        time.sleep(retry_s)


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def wait_status(pid: int) -> int:
    """The child's exit status, *without* reaping it (``WNOWAIT``): until the runner has written
    ``exit.json`` the job stays a zombie, so if the runner is killed in between, the job is
    re-parented to the daemon (a child subreaper), which reaps it and gets the same status."""
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except InterruptedError:
            continue
        if info is None:
            continue
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="collocate.node.runner")
    parser.add_argument("--dir", required=True, type=Path, help="the attempt's folder")
    parser.add_argument("--uid", type=int, default=None, help="run the job as this user")
    parser.add_argument("--gid", type=int, default=None, help="with this group")
    parser.add_argument("--cwd", required=True, help="the job's working directory (entered as the job's user)")
    parser.add_argument("--env-file", required=True, type=Path, help="the job's environment (JSON, removed once read)")
    parser.add_argument("--command-file", type=Path, default=None,
                        help="the job's command (JSON, removed once read): never on this command line")
    parser.add_argument("--confine", default=None, help="the attempt's cgroup (collocate.node.cgroups, JSON)")
    parser.add_argument("--log-max", type=int, default=1 << 62, help="bytes kept of each log stream")
    parser.add_argument("--disk-reserve", type=int, default=0, help="free bytes logs never take")
    parser.add_argument("--fence", type=Path, default=None, help="the node agent's heartbeat file")
    parser.add_argument("--fence-after", type=float, default=60.0, help="stop the job when the "
                        "heartbeat is older than this (its attempt is requeued elsewhere)")
    parser.add_argument("--pty", action="store_true", help="an interactive job (`collocate run`): "
                        "on a terminal served on the attempt's pty.sock (collocate.node.ptyjob)")
    parser.add_argument("--quota-file", default=None,
                        help="the owner's storage ledger: logs stop at their quota (logkeeper.Ledger)")
    parser.add_argument("--stdin-file", type=Path, default=None,
                        help="the job's stdin (a --notify command's summary; else /dev/null)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="stop the job's whole tree after this many seconds (a --notify command)")
    parser.add_argument("--output", default=None, help="the member's file for stdout (and stderr "
                        "without --error), written as them (collocate.node.outfiles)")
    parser.add_argument("--error", default=None, help="the member's file for stderr")
    parser.add_argument("--append", action="store_true", help="append to them (a later attempt)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    stop_requested: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stop_requested.append(signum))
    me = os.getpid()
    import psutil  # imported late: the runner must start fast

    write_json_atomic(ns.dir / "runner.json",
                      {"pid": me, "started": psutil.Process(me).create_time(), "at": time.time()})
    env = with_fence_path(read_env_file(ns.env_file))  # a fenced PyTorch job: its sitecustomize
    if ns.command_file is not None:
        command = read_command_file(ns.command_file)
    stderr_path = ns.dir / "stderr.log"
    if stop_requested:  # cancelled before the job even started
        write_json_atomic(ns.dir / "exit.json", {"returncode": -stop_requested[0], "end": time.time(),
                                                  "stderr_tail": ""})
        return 0
    try:
        writer, copies = _start_writer(ns, env)
    except OSError as exc:  # the member cannot write their --output: the job does not start
        print(f"collocate: {exc}", file=sys.stderr, flush=True)
        write_json_atomic(ns.dir / "exit.json", {"returncode": 1, "end": time.time(),
                                                  "stderr_tail": read_tail(stderr_path)})
        return 0
    tree = JobTree.confined(ns.confine)
    keeper, (out_w, err_w) = _start_keeper(ns.log_max, ns.disk_reserve, str(ns.dir), ns.quota_file, copies)
    # The job inherits the runner's session and process group; signals reach both. Forked by
    # hand (the runner has no threads) so that privileges are dropped *before* the job's cwd is
    # entered, and nothing of the job's environment touches this root-side process.
    # The job waits for a go byte until ``child.json`` names it: a job that runs is always
    # recorded as started, so a runner killed at any moment never gets it run twice.
    terminal = None
    if ns.pty:
        from collocate.node.ptyjob import Terminal

        terminal = Terminal(ns.dir, owner=ns.uid)
    stdin = _open_stdin(ns.stdin_file)
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_write)
        if stdin is not None:
            os.dup2(stdin, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        if terminal is not None:
            terminal.enter_child()
        tree.enter()  # as root, before it drops privileges: it cannot leave its cgroup
        if os.read(go_read, 1) != b"g":  # the runner died before recording it: do not run
            os._exit(125)
        os.close(go_read)
        exec_as(command, env, ns.cwd, ns.uid, ns.gid)
    os.close(go_read)
    if terminal is None:
        os.close(out_w)
    os.close(err_w)
    if stdin is not None:
        os.close(stdin)
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = None
    write_json_atomic(ns.dir / "child.json", {"pid": pid, "started": started})
    if terminal is None or terminal.await_client(stop_requested):  # an interactive job starts
        os.write(go_write, b"g")  # once its member's terminal is attached (else: exit 125)
    os.close(go_write)
    if stop_requested:  # the group signal may have come before the child existed
        os.kill(pid, stop_requested[0])
    fenced = None
    if terminal is not None:  # what it prints is kept in stdout.log as well
        returncode = terminal.serve(pid, out_w, stop_requested, exclude={me, keeper})
        os.close(out_w)
    elif ns.fence is None and ns.time_limit is None:
        returncode = wait_status(pid)
    else:
        deadline = None if ns.time_limit is None else time.monotonic() + ns.time_limit
        returncode, fenced = _wait_fenced(pid, tree, ns.fence, ns.fence_after, exclude={me, keeper},
                                          deadline=deadline)
        if fenced and ns.fence is None:  # a time limit, not a fence
            fenced = f"stopped at its time limit of {ns.time_limit:g} s, with all it started"
            _note(stderr_path, fenced)
    tree.kill_rest(exclude={me, keeper, *writer})  # nothing the job started outlives it
    _wait_keeper(keeper)
    for w in writer:  # the member's --output file is whole when the job is seen ended
        _wait_keeper(w)
    record: dict[str, object] = {"returncode": returncode, "end": time.time(), **tree.usage()}
    note = tree.memory_note()
    if note:
        _note(stderr_path, note)
    if fenced:
        record["lost" if ns.fence is not None else "timed_out"] = fenced
    record["stderr_tail"] = read_tail(stderr_path)
    write_record_until_written(ns.dir / "exit.json", record)
    os.waitpid(pid, 0)  # only now: the record is safe
    tree.remove()
    return 0


def _start_writer(ns: argparse.Namespace, env: dict[str, str]) -> tuple[tuple[int, ...], dict[str, int]]:
    """The member's ``--output``/``--error`` writer (``collocate.node.outfiles``), if asked
    for: its pid and the pipes the keeper copies the streams to. OSError if it cannot open them."""
    paths = {name: path for name, path in (("stdout", ns.output), ("stderr", ns.error or ns.output)) if path}
    if not paths:
        return (), {}
    from collocate.node.outfiles import OutputError, start_writer

    header = (f"[collocate: attempt {env.get('COLLOCATE_ATTEMPT', '?')} of job "
              f"{env.get('COLLOCATE_JOB_ID', '?')} starts here]\n")
    try:
        pid, copies = start_writer(paths, uid=ns.uid, gid=ns.gid, append=ns.append, header=header)
    except OutputError as exc:
        raise OSError(str(exc)) from None
    return (pid,), copies


def _start_keeper(max_bytes: int, reserve: int, disk: str, quota_file: str | None = None,
                  copies: dict[str, int] | None = None) -> tuple[int, tuple[int, int]]:
    """Fork the log keeper (``collocate.node.logkeeper``) on two pipes whose write ends the job
    gets as stdout and stderr; the keeper writes the runner's own stdout and stderr (the logs),
    and ``copies`` (the member's ``--output`` writer's pipes, closed here once it has them)."""
    from collocate.node.logkeeper import keep

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    keeper = os.fork()
    if keeper == 0:
        try:
            os.close(out_w)
            os.close(err_w)
            keep({"stdout": (out_r, os.dup(1)), "stderr": (err_r, os.dup(2))},
                 max_bytes=max_bytes, reserve_bytes=reserve, disk=disk, quota_file=quota_file,
                 copies=copies)
        finally:
            os._exit(0)
    os.close(out_r)
    os.close(err_r)
    for fd in (copies or {}).values():
        os.close(fd)
    return keeper, (out_w, err_w)


def _wait_keeper(keeper: int, timeout_s: float = 10.0) -> None:
    """Until the keeper has written the last of the logs (every writer is gone by now); a keeper
    still held open after ``timeout_s`` (an unconfined job's escaped process) is left to run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(keeper, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)


def _open_stdin(path: Path | None) -> int | None:
    """The job's stdin file, opened here as root (it is the daemon's, 0600), never a symlink."""
    if path is None:
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None


def _wait_fenced(pid: int, tree: JobTree, heartbeat: Path | None, after_s: float, *,
                 exclude: set[int], deadline: float | None = None) -> tuple[int, str | None]:
    """``wait_status`` on a node of a cluster: the head's agent touches ``heartbeat`` on every
    round; when it is older than ``after_s`` the head records this attempt lost and runs the job
    elsewhere, so the job is stopped here first (fencing): it never runs twice. With
    ``deadline`` (``time.monotonic``), the job's whole tree is stopped then (a ``--notify``
    command's time limit)."""
    fenced = None
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            info = None
        if info is not None and info.si_pid:
            status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            return status, fenced
        if fenced is None and deadline is not None and time.monotonic() > deadline:
            fenced = "stopped at its time limit: it ran too long"
            tree.kill_rest(exclude=exclude)
        if fenced is None and heartbeat is not None:
            try:
                age = time.time() - heartbeat.stat().st_mtime
            except OSError:
                age = 0.0  # no heartbeat file yet: nothing to judge by
            if age > after_s:
                fenced = (f"stopped on its node: the node's collocate agent was gone for {age:.0f} s "
                          f"(over --node-grace-s {after_s:g}); requeued")
                tree.kill_rest(exclude=exclude)
        time.sleep(0.25)


def _note(path: Path, text: str) -> None:
    try:
        with open(path, "a") as f:
            f.write(f"collocate: {text}\n")
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
