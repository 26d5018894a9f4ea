"""Turn a placement into launch plans: one per node the attempt runs on (pure).

``plan_launch`` builds the exact argv, environment and cwd one part of an attempt gets, so tests
assert on the plan without starting anything; the node that runs it (``node/launcher.py``) adds
what its machine enforces. A job on several nodes gets one part per node, told its place by the
variables torchrun and ``torch.distributed`` read (``rendezvous_env``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from collocate.core.model import Job, Placement, SharingMode
from collocate.core.recovery import job_fence_mib
from collocate.gpus.mps import MpsDirs, mps_client_env
from collocate.monitor.job_metrics import metrics_env
from collocate.node.fence import ENV_MEM_FENCE
from collocate.node.isolate import bootstrap_argv
from collocate.node.launcher import COMMAND_FILE, ENV_EMULATED_DIR, ENV_FILE, RUNNER_MODULE, LaunchPlan
from collocate.wire.outputs import fill
from collocate.wire.spec import JobSpec


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where the parts of a job on several nodes meet: how many nodes, this part's rank, and
    rank 0's address and a port free there."""

    nnodes: int
    rank: int
    master_addr: str
    master_port: int


def rendezvous_env(r: Rendezvous) -> dict[str, str]:
    """What ``torch.distributed`` (``MASTER_ADDR``/``MASTER_PORT``, with ``NNODES`` and
    ``NODE_RANK`` for scripts) and torchrun (its options as ``PET_*`` variables: ``--nnodes``,
    ``--node-rank``, ``--master-addr``, ``--master-port``) read, so ``torchrun --nproc-per-node
    G train.py`` rendezvouses with no extra arguments."""
    values = {"NNODES": str(r.nnodes), "NODE_RANK": str(r.rank), "MASTER_ADDR": r.master_addr,
              "MASTER_PORT": str(r.master_port)}
    return {**values, **{f"PET_{k}": v for k, v in values.items()}}


def placement_room(job: Job, placement: Placement) -> float | None:
    """The room the attempt's GPUs had for it when placed (a job of unknown memory: what it
    was placed with)."""
    return placement.room_mib if placement.room_mib is not None else (
        placement.mem_mib if job.mem_mib is None else None)


def fence_env(job: Job, placement: Placement) -> dict[str, str]:
    """``COLLOCATE_MEM_FENCE_MIB``: the MiB a fenced attempt may hold on each GPU, under every
    sharing mode (``collocate.node.fence``); nothing for an unfenced one."""
    fence = job_fence_mib(job, placement_room(job, placement))
    return {} if fence is None else {ENV_MEM_FENCE: f"{fence:.0f}"}


def mps_env(job: Job, placement: Placement, dirs: MpsDirs) -> dict[str, str]:
    """Per-client MPS limits (``collocate.gpus.mps`` formats them).

    Thread percentage: never set (no policy caps threads). A job's solo SM activity is
    not a safe cap: on an H100 (2026-11-23, docs/gpu-validation.md) capping each job at its solo
    activity slowed jobs that ran alone by up to 1.9x (the transformer, capped at 91%), and the
    measured MPS interference model assumes uncapped clients. Pinned memory: the requirement's
    upper bound plus a margin, the room a job of unknown memory was placed with, for an estimate
    the larger of the two (``collocate.core.commitment.mps_limit_mib``, the rule the simulator
    applies too); none for an unfenced attempt (``collocate.core.recovery.job_fence_mib``).
    """
    limit = job_fence_mib(job, placement_room(job, placement))
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
    rendezvous: Rendezvous | None = None,
) -> LaunchPlan:
    """One part's plan: ``placement`` and ``uuids`` are the GPUs of this part's node only (none
    for a CPU job: ``CUDA_VISIBLE_DEVICES`` empty, so CUDA sees no device, and no MPS variables)."""
    env = dict(spec.env)
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "COLLOCATE_JOB_ID": job.id,
        "COLLOCATE_ATTEMPT": str(attempt),
        "COLLOCATE_SHARING": sharing.value,
    })
    if rendezvous is not None:
        env.update(rendezvous_env(rendezvous))
    if emulated_dir is not None:
        env[ENV_EMULATED_DIR] = str(emulated_dir)
    if sharing is SharingMode.MPS and mps_dirs is not None and placement.gpus:  # not a CPU job
        env.update(mps_env(job, placement, mps_dirs))
    env.update(fence_env(job, placement))
    daemon_uid = os.getuid() if daemon_uid is None else daemon_uid
    as_other = daemon_uid == 0 and spec.uid not in (-1, 0)
    if not as_other:  # where log_metric() appends; a job run as another user cannot write the
        env.update(metrics_env(attempt_dir))  # state dir, so it gets none (log_metric: no-op)
    as_user = ("--uid", str(spec.uid), "--gid", str(spec.gid)) if as_other else ()
    interactive = ("--pty",) if job.interactive else ()  # `collocate run`: node/ptyjob.py
    argv = (*bootstrap_argv(RUNNER_MODULE), "--dir", str(attempt_dir), *as_user, *interactive,
            *output_args(job, spec, attempt, rendezvous), "--cwd", spec.cwd, "--env-file", str(attempt_dir / ENV_FILE),
            "--command-file", str(attempt_dir / COMMAND_FILE))
    return LaunchPlan(argv, env, spec.cwd, attempt_dir,
                      spec.uid if as_other else None, spec.gid if as_other else None, tuple(spec.argv))


def output_args(job: Job, spec: JobSpec, attempt: int, rendezvous: Rendezvous | None) -> tuple[str, ...]:
    """The runner's ``--output``/``--error`` files (``submit -o/-e``, ``wire/outputs.py``):
    written by rank 0's part only (one file, as sbatch's batch step), truncated by the first
    attempt and appended to by later ones, so a retry never loses what the first one wrote."""
    if spec.output is None and spec.error is None or rendezvous is not None and rendezvous.rank:
        return ()
    names = {"job_id": job.id, "name": job.name, "user": spec.user or job.user, "sweep": job.sweep}
    args: tuple[str, ...] = ()
    if spec.output is not None:
        args += ("--output", fill(spec.output, **names))
    if spec.error is not None:
        args += ("--error", fill(spec.error, **names))
    return (*args, "--append") if attempt > 1 else args
