"""What the runners of one machine enforce on every attempt they start.

An attempt's bounds are the machine's business, not the plan's: the head of a cluster plans a
launch, and the machine that starts it adds what holds there (``LocalExecutor`` on one
machine, ``cluster.agent.NodeAgent`` on each node). So the plan stays the same everywhere and
``runner_args`` gives the runner:

* its cgroup (``collocate.daemon.cgroups``): pids and host memory limits, and the device
  numbers of this machine's GPUs the attempt was not given;
* its logs' bounds (``collocate.daemon.logkeeper``): ``--log-max`` and the disk reserve;
* on a cluster node, fencing: the agent's heartbeat file and how stale it may get before the
  runner stops the job (the head requeues the attempt of a node silent that long).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collocate.daemon.cgroups import AttemptCgroup, Cgroups, gpu_denials

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
