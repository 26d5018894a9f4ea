"""The small wrapper process each job runs under: ``python -m collocate.daemon.runner``.

Why a wrapper: the daemon may be killed (even with SIGKILL) while jobs run. The runner, not the
daemon, is the job's parent: it starts the command in its own session (so the whole job is one
process group the daemon can signal), waits for it, and writes the exit status, end time and
stderr tail to ``exit.json`` atomically. A restarted daemon re-adopts a live runner (pid and
process start time, recorded in ``runner.json`` and in SQLite) or reads the exit record of a job
that ended while it was down. Nothing about the job is lost with the daemon's memory.

The runner survives SIGTERM/SIGINT/SIGHUP itself: a cancel signals the whole process group, the
job gets the signal, and the runner records how it ended. A signal that arrives before the job
has started is passed on to it (or the job is not started at all).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TAIL_BYTES = 16 * 1024  # how much of stderr is kept with an attempt and inspected for OOM


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="collocate.daemon.runner")
    parser.add_argument("--dir", required=True, type=Path, help="the attempt's folder")
    parser.add_argument("--uid", type=int, default=None, help="run the job as this user")
    parser.add_argument("--gid", type=int, default=None, help="with this group")
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
    stderr_path = ns.dir / "stderr.log"
    if stop_requested:  # cancelled before the job even started
        write_json_atomic(ns.dir / "exit.json", {"returncode": -stop_requested[0], "end": time.time(),
                                                  "stderr_tail": ""})
        return 0
    try:
        # The job inherits the runner's session and process group; signals reach both.
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            restore_signals=True,  # our Python-level handlers are reset to default by exec
            user=ns.uid,
            group=None if ns.gid is None or ns.gid < 0 else ns.gid,
            extra_groups=[] if ns.uid is not None else None,  # no root supplementary groups
        )
    except OSError as exc:
        print(f"collocate: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_json_atomic(ns.dir / "exit.json",
                          {"returncode": 127, "end": time.time(), "stderr_tail": read_tail(stderr_path),
                           "error": str(exc)})
        return 127
    write_json_atomic(ns.dir / "child.json", {"pid": child.pid})
    if stop_requested:  # the group signal may have come before the child existed
        child.send_signal(stop_requested[0])
    while True:
        try:
            returncode = child.wait()
            break
        except InterruptedError:
            continue
    sys.stderr.flush()
    write_json_atomic(ns.dir / "exit.json",
                      {"returncode": returncode, "end": time.time(),
                       "stderr_tail": read_tail(stderr_path)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
