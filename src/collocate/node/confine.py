"""What the runners of one machine enforce on every attempt they start.

An attempt's bounds are the machine's business, not the plan's: the head of a cluster plans a
launch, and the machine that starts it adds what holds there (``LocalNode`` on one
machine, ``cluster.agent.NodeAgent`` on each node). So the plan stays the same everywhere and
``runner_args`` gives the runner:

* its cgroup (``collocate.node.cgroups``): pids and host memory limits, and the device
  numbers of this machine's GPUs the attempt was not given;
* its logs' bounds (``collocate.node.logkeeper``): ``--log-max`` and the disk reserve;
* on a cluster node, fencing: the agent's heartbeat file and how stale it may get before the
  runner stops the job (the head requeues the attempt of a node silent that long).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collocate.node.cgroups import AttemptCgroup, Cgroups, gpu_denials

UNLIMITED = 1 << 62


@dataclass
class Confinement:
    cgroups: Cgroups = field(default_factory=lambda: Cgroups(None, "not asked for"))
    log_max: int = UNLIMITED
    disk_reserve: int = 0
    minors: Mapping[str, int | None] = field(default_factory=dict)  # GPU uuid -> /dev/nvidiaN
    fence: tuple[Path, float] | None = None  # (heartbeat file, seconds)

    def cgroup(self, job_id: str, n: int, uuids: Sequence[str]) -> AttemptCgroup | None:
        deny = gpu_denials([self.minors.get(u) for u in uuids], list(self.minors.values()))
        return self.cgroups.attempt(job_id, n, deny)

    def runner_args(self, job_id: str, n: int, uuids: Sequence[str]) -> list[str]:
        args = ["--log-max", str(self.log_max), "--disk-reserve", str(self.disk_reserve)]
        cgroup = self.cgroup(job_id, n, uuids)
        if cgroup is not None:
            import json

            args += ["--confine", json.dumps(cgroup.to_json())]
        if self.fence is not None:
            args += ["--fence", str(self.fence[0]), "--fence-after", f"{self.fence[1]:g}"]
        return args

    def signal(self, job_id: str, n: int, pid: int | None, sig: int) -> None:
        """Signal an attempt's job: SIGKILL ends its whole cgroup (the runner lives on to record
        the end), other signals go to its process group and to every process in its cgroup
        (those that left the group with ``setsid`` too). Without a cgroup, the process group."""
        cgroup = self.cgroup(job_id, n, ())
        if cgroup is not None and sig == signal.SIGKILL and _exists(cgroup):
            cgroup.kill(timeout_s=2.0)
            return
        signal_group(pid, sig)
        if cgroup is not None:
            cgroup.signal(sig)
            if _exists(cgroup):
                cgroup.freeze(False)  # a frozen (suspended) job acts on the signal once thawed
        elif sig != signal.SIGCONT:
            signal_group(pid, signal.SIGCONT)  # ... and one stopped by SIGSTOP once continued

    def freeze(self, job_id: str, n: int, pid: int | None, frozen: bool) -> str:
        """Freeze (or thaw) an attempt's job: its cgroup's freezer, else SIGSTOP (SIGCONT) to its
        process group, which a process that left the group escapes. How it was done."""
        cgroup = self.cgroup(job_id, n, ())
        if cgroup is not None and _exists(cgroup) and cgroup.freeze(frozen):
            return "cgroup freezer"
        signal_group(pid, signal.SIGSTOP if frozen else signal.SIGCONT)
        return "SIGSTOP/SIGCONT"

    def release(self, job_id: str, n: int) -> None:
        """An attempt has ended: stop whatever of it is left and remove its cgroup."""
        cgroup = self.cgroup(job_id, n, ())
        if cgroup is not None and _exists(cgroup):
            cgroup.kill(timeout_s=2.0)
            cgroup.remove()


def _exists(cgroup: AttemptCgroup) -> bool:
    return any(os.path.isdir(d) for d in cgroup.dirs.values())


def signal_group(pid: int | None, sig: int) -> None:
    """Signal the process group a runner leads (its pid is the group's id); gone is fine."""
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


MIB = 2**20


def default_log_max(disk_bytes: int) -> int:
    """Bytes kept of each log stream when the owner gave none: 64 MiB, at most 1/32 of the disk."""
    return min(64 * MIB, disk_bytes // 32)


def default_disk_reserve(disk_bytes: int) -> int:
    """Free bytes kept for records when the owner gave none: 5 % of the disk, 1 MiB to 1 GiB."""
    return min(1024 * MIB, max(MIB, disk_bytes // 20))


@dataclass(frozen=True, slots=True)
class NodeBounds:
    """What the daemon's owner bounds every attempt by, wherever it runs; a node resolves the
    disk-relative defaults (None) against its own disk."""

    max_pids: int | None = None
    max_memory: int | None = None
    log_max: int | None = None
    disk_reserve: int | None = None


def local_confinement(key: str, devices: Sequence, bounds: NodeBounds, disk_bytes: int, *,
                      keep: set[str], fence: tuple[Path, float] | None = None) -> Confinement:
    """This machine's bounds on every attempt: cgroups prepared for the daemon or agent ``key``
    names (its state root), those an earlier run left empty removed (except ``keep``: open
    attempts, ``job-<id>.<n>``), the owner's log bounds, the GPUs' device numbers, and on a
    cluster node the fence."""
    cgroups = Cgroups.detect(key, max_pids=bounds.max_pids, max_memory=bounds.max_memory)
    cgroups.sweep(keep=keep)
    log_max = bounds.log_max if bounds.log_max is not None else default_log_max(disk_bytes)
    reserve = bounds.disk_reserve if bounds.disk_reserve is not None else default_disk_reserve(disk_bytes)
    return Confinement(cgroups, log_max=log_max, disk_reserve=reserve,
                       minors={d.uuid: d.minor for d in devices}, fence=fence)
