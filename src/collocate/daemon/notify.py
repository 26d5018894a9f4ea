"""``submit --notify CMD``: run the user's command once their job has ended (Slurm's
``--mail-type=END``, as a command so that mail, a chat webhook through ``curl`` or a desktop
notification all work the same way).

The command runs as the job's user, in the job's working directory and environment, exactly as
the job's own process does (``isolate``: a root daemon never runs it as root), with
``COLLOCATE_JOB_ID``, ``COLLOCATE_JOB_NAME``, ``COLLOCATE_JOB_STATE``, ``COLLOCATE_JOB_REASON``
and ``COLLOCATE_JOB_EXIT_CODE`` set and a one-line summary on its stdin (so ``mail -s subject
you@lab`` sends it). Started, never waited for: a slow or hanging command holds nothing up (the
daemon, as its processes' subreaper, reaps it). Its output goes to
``<state>/jobs/<id>/notify.log``; how it started goes to ``daemon.log``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from collocate.daemon.paths import StateLayout
from collocate.daemon.spec import JobSpec
from collocate.daemon.store import Store
from collocate.model import Job
from collocate.node.isolate import CLEAN_ENV, bootstrap_argv, write_env_file

log = logging.getLogger("collocate.daemon")


class Notifier:
    """Fires each job's ``--notify`` command when the job reaches a final state, once."""

    def __init__(self, layout: StateLayout, specs: Mapping[str, JobSpec], store: Store) -> None:
        self.layout, self.specs, self.store = layout, specs, store

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
        summary = f"collocate job {job.id} ({job.name}) {job.state.value}"
        if job.reason and job.state.value != "done":
            summary += f": {job.reason}"
        env = {**spec.env, "COLLOCATE_JOB_ID": job.id, "COLLOCATE_JOB_NAME": job.name,
               "COLLOCATE_JOB_STATE": job.state.value, "COLLOCATE_JOB_REASON": job.reason,
               "COLLOCATE_JOB_EXIT_CODE": "" if exit_code is None else str(exit_code)}
        env_file = folder / "notify.env"
        write_env_file(env_file, env)
        as_other = os.getuid() == 0 and spec.uid not in (-1, 0)
        as_user = ("--uid", str(spec.uid), "--gid", str(spec.gid)) if as_other else ()
        argv = [*bootstrap_argv("collocate.node.isolate"), *as_user, "--cwd", spec.cwd,
                "--env-file", str(env_file), "--", *spec.notify]
        fd = os.open(folder / "notify.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=fd, stderr=fd, env=CLEAN_ENV,
                                    cwd=str(folder), start_new_session=True)
        finally:
            os.close(fd)
        try:
            assert proc.stdin is not None
            proc.stdin.write((summary + "\n").encode(errors="replace"))
            proc.stdin.close()
        except OSError:  # it exited without reading: fine
            pass
        log.info("job %s: --notify started (pid %d)", job.id, proc.pid)
