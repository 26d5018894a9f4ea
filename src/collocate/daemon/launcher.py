"""Turn a placement into a running process: the launch plan (pure) and the start (I/O).

``plan_launch`` builds the exact argv, environment and cwd a job gets, so tests assert on the
plan without starting anything. ``start`` runs it through ``collocate.daemon.runner`` in a new
session (its own process group), with stdout/stderr going to the attempt's log files; when the
daemon runs as root, the job runs as the user who submitted it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from collocate.commitment import mps_limit_mib
from collocate.daemon.isolate import CLEAN_ENV, bootstrap_argv, write_env_file
from collocate.daemon.paths import attempt_files
from collocate.daemon.spec import JobSpec
from collocate.gpus.mps import MpsDirs, mps_client_env
from collocate.model import Job, Placement, SharingMode
from collocate.monitor.job_metrics import metrics_env

ENV_EMULATED_DIR = "COLLOCATE_EMULATED_DIR"  # the emulated backend's contract with its jobs
ENV_FILE = "env.json"  # the job's environment for the runner; removed once read


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything needed to start one attempt; printable and comparable in tests."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    dir: Path
    uid: int | None  # run as this user (daemon is root and the submitter is someone else)
    gid: int | None


def mps_env(job: Job, placement: Placement, dirs: MpsDirs) -> dict[str, str]:
    """Per-client MPS limits (``collocate.gpus.mps`` formats them).

    Thread percentage: never set (no policy caps threads). A job's solo SM activity is
    not a safe cap: on an H100 (2026-11-23, docs/gpu-validation.md) capping each job at its solo
    activity slowed jobs that ran alone by up to 1.9x (the transformer, capped at 91%), and the
    measured MPS interference model assumes uncapped clients. Pinned memory: the requirement's
    upper bound plus a margin, the room a job of unknown memory was placed with, for an estimate
    the larger of the two (``collocate.commitment.mps_limit_mib``, the rule the simulator
    applies too).
    """
    room = placement.room_mib if placement.room_mib is not None else (
        placement.mem_mib if job.mem_mib is None else None)
    limit = mps_limit_mib(job.mem_mib, room, job.mem_uncertainty, job.mem_source)
    return mps_client_env(dirs=dirs, mem_mib=limit, margin_mib=0.0,
                          devices=[str(i) for i in range(len(placement.gpus))])


def plan_launch(
    job: Job,
    spec: JobSpec,
    placement: Placement,
    uuids: Sequence[str],
    *,
    attempt: int,
    attempt_dir: Path,
    sharing: SharingMode,
    emulated_dir: Path | None,
    mps_dirs: MpsDirs | None = None,
    daemon_uid: int | None = None,
) -> LaunchPlan:
    env = dict(spec.env)
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "COLLOCATE_JOB_ID": job.id,
        "COLLOCATE_ATTEMPT": str(attempt),
        "COLLOCATE_SHARING": sharing.value,
    })
    if emulated_dir is not None:
        env[ENV_EMULATED_DIR] = str(emulated_dir)
    if sharing is SharingMode.MPS and mps_dirs is not None:
        env.update(mps_env(job, placement, mps_dirs))
    daemon_uid = os.getuid() if daemon_uid is None else daemon_uid
    as_other = daemon_uid == 0 and spec.uid not in (-1, 0)
    if not as_other:  # where log_metric() appends; a job run as another user cannot write the
        env.update(metrics_env(attempt_dir))  # state dir, so it gets none (log_metric: no-op)
    as_user = ("--uid", str(spec.uid), "--gid", str(spec.gid)) if as_other else ()
    argv = (*bootstrap_argv(RUNNER_MODULE), "--dir", str(attempt_dir), *as_user,
            "--cwd", spec.cwd, "--env-file", str(attempt_dir / ENV_FILE), "--", *spec.argv)
    return LaunchPlan(argv, env, spec.cwd, attempt_dir,
                      spec.uid if as_other else None, spec.gid if as_other else None)


RUNNER_MODULE = "collocate.daemon.runner"


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
    (``collocate.daemon.isolate``: ``python -I``, a clean environment, the attempt dir as its
    cwd); it drops to the submitting user (``--uid/--gid``) and only then enters the job's cwd
    and takes the job's environment (from a 0600 file it removes). Log files are opened here
    and inherited, so the job needs no access to the state dir.
    """
    plan.dir.mkdir(parents=True, exist_ok=True)
    files = attempt_files(plan.dir)
    write_env_file(plan.dir / ENV_FILE, plan.env)
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

