"""``submit --notify CMD``: run the user's command once their job has ended (Slurm's
``--mail-type=END``, as a command so that mail, a chat webhook through ``curl`` or a desktop
notification all work the same way).

The command runs as a short part of the job of its own (issue 36): through the same runner as
the job's attempts (``collocate.node.runner``), as the job's user, in the job's working
directory and environment, in a cgroup of its own (``job-<id>.0``) under the member's pids and
memory limits, with its output through the log keeper (capped at ``--log-max``, counted in the
member's stored bytes, ``collocate logs ID --notify``), and stopped with all it started after
``NOTIFY_TIME_LIMIT_S``. ``COLLOCATE_JOB_ID``, ``COLLOCATE_JOB_NAME``, ``COLLOCATE_JOB_STATE``,
``COLLOCATE_JOB_REASON`` and ``COLLOCATE_JOB_EXIT_CODE`` are set and a one-line summary is on
its stdin (so ``mail -s subject you@lab`` sends it). Started, never waited for: a slow or
hanging command holds nothing up (its runner stops it; the daemon, as its processes'
subreaper, reaps the runner). Its files are in ``<state>/jobs/<id>/notify/``; how it started
goes to ``daemon.log``. Its command, like a job's, is read from a 0600 file, never from a root
process's command line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from collocate.core.model import Job
from collocate.daemon.store import Store
from collocate.node.confine import Confinement
from collocate.node.files import drop_logs
from collocate.node.isolate import bootstrap_argv
from collocate.node.launcher import COMMAND_FILE, ENV_FILE, RUNNER_MODULE, LaunchPlan, start, with_runner_args
from collocate.wire.paths import StateLayout
from collocate.wire.spec import JobSpec

#: How long a ``--notify`` command may run before it is stopped with all it started: mail or a
#: webhook takes seconds; a command still running after a minute is stuck or is not a notice.
NOTIFY_TIME_LIMIT_S = 60.0
#: The notify's part number: its cgroup is ``job-<id>.0`` (attempts count from 1).
NOTIFY_PART = 0
STDIN_FILE = "stdin.txt"


def notify_dir(root: Path, job_id: str) -> Path:
    """Where a job's ``--notify`` runs: its runner's records and its logs."""
    return root / "jobs" / job_id / "notify"


def drop_notify_logs(root: Path, job_id: str) -> int:
    """Remove a job's ``--notify`` logs once its notify has ended (``collocate purge``); the
    bytes freed. One still running keeps them: its keeper writes them (at most a minute)."""
    folder = notify_dir(root, job_id)
    return drop_logs(folder) if (folder / "exit.json").exists() else 0


def plan_notify(job: Job, spec: JobSpec, folder: Path, exit_code: int | None, *,
                daemon_uid: int, time_limit_s: float = NOTIFY_TIME_LIMIT_S) -> LaunchPlan:
    """The notify's launch plan (pure): the runner, as the job's user, with the command in a
    private file, its stdin the summary, and its time limit."""
    env = {**spec.env, "COLLOCATE_JOB_ID": job.id, "COLLOCATE_JOB_NAME": job.name,
           "COLLOCATE_JOB_STATE": job.state.value, "COLLOCATE_JOB_REASON": job.reason,
           "COLLOCATE_JOB_EXIT_CODE": "" if exit_code is None else str(exit_code)}
    as_other = daemon_uid == 0 and spec.uid not in (-1, 0)
    as_user = ("--uid", str(spec.uid), "--gid", str(spec.gid)) if as_other else ()
    argv = (*bootstrap_argv(RUNNER_MODULE), "--dir", str(folder), *as_user, "--cwd", spec.cwd,
            "--env-file", str(folder / ENV_FILE), "--command-file", str(folder / COMMAND_FILE),
            "--stdin-file", str(folder / STDIN_FILE), "--time-limit", f"{time_limit_s:g}")
    return LaunchPlan(argv, env, spec.cwd, folder, spec.uid if as_other else None,
                      spec.gid if as_other else None, tuple(spec.notify))


def summary_line(job: Job) -> str:
    summary = f"collocate job {job.id} ({job.name}) {job.state.value}"
    if job.reason and job.state.value != "done":
        summary += f": {job.reason}"
    return summary

log = logging.getLogger("collocate.daemon")


class Notifier:
    """Fires each job's ``--notify`` command when the job reaches a final state, once."""

    def __init__(self, layout: StateLayout, specs: Mapping[str, JobSpec], store: Store,
                 confinement: Confinement | None = None,
                 extra_args: Callable[[JobSpec], Sequence[str]] = lambda spec: ()) -> None:
        """``confinement``: this machine's bounds on every part it starts (the local node's:
        cgroup limits, log bounds); ``extra_args``: more runner arguments for a job's owner
        (the member's storage quota, ``collocate.daemon.quotas``)."""
        self.layout, self.specs, self.store = layout, specs, store
        self.confinement = confinement or Confinement()
        self.extra_args = extra_args

    def changed(self, job: Job) -> None:
        """The scheduler's ``on_change`` (after the store saved the job)."""
        spec = self.specs.get(job.id)
        if spec is None or not spec.notify or not job.state.is_terminal:
            return
        attempts = self.store.attempts(job.id)
        exit_code = attempts[-1].returncode if attempts else None
        folder = self.layout.root / "jobs" / job.id
        marker = folder / "notified"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)  # once per job, across restarts
        except FileExistsError:
            return
        except OSError as exc:
            log.warning("job %s: --notify not run: %s", job.id, exc)
            return
        try:
            self._start(job, spec, folder, exit_code)
        except OSError as exc:  # never into the loop: a notification is best effort
            log.warning("job %s: --notify %r could not start: %s", job.id, spec.notify[0], exc)

    def _start(self, job: Job, spec: JobSpec, folder: Path, exit_code: int | None) -> None:
        part = notify_dir(self.layout.root, job.id)
        part.mkdir(exist_ok=True)
        fd = os.open(part / STDIN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(summary_line(job) + "\n")
        plan = plan_notify(job, spec, part, exit_code, daemon_uid=os.getuid())
        plan = with_runner_args(plan, *self.confinement.runner_args(job.id, NOTIFY_PART, ()),
                                *self.extra_args(spec))
        proc, _ = start(plan)
        log.info("job %s: --notify started (runner pid %d)", job.id, proc.pid)
