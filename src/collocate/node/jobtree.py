"""A job's whole process tree, as its runner stops it: its cgroup, or else its process group.

With a cgroup (``collocate.node.cgroups``) every process the job starts is found, whatever it
does with sessions (``setsid``) or hang-up signals (``nohup``). Without one (cgroups not
writable here) the runner falls back to the process group the job shares with it, which stops
``nohup cmd &`` but not ``setsid cmd &``; ``collocate serve`` says which applies when it starts.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from collocate.node.cgroups import AttemptCgroup


class JobTree:
    def __init__(self, cgroup: AttemptCgroup | None) -> None:
        self.cgroup = cgroup

    @classmethod
    def confined(cls, plan: str | None) -> JobTree:
        """The tree in the cgroup ``plan`` (JSON) describes, created now; unconfined (said on
        the job's stderr) when none was planned or it cannot be made."""
        if not plan:
            return cls(None)
        cgroup = AttemptCgroup.from_json(json.loads(plan))
        try:
            cgroup.create()
        except OSError as exc:
            print(f"collocate: the job runs unconfined: cannot create its cgroup ({exc})",
                  file=sys.stderr, flush=True)
            return cls(None)
        return cls(cgroup)

    def enter(self) -> None:
        """In the job's process, before it drops privileges (it could not leave afterwards)."""
        if self.cgroup is None:
            return
        try:
            self.cgroup.enter()
        except OSError as exc:  # never run a job outside the limits its owner set
            os.write(2, f"collocate: cannot enter the job's cgroup: {exc}\n".encode(errors="replace"))
            os._exit(126)

    def kill_rest(self, *, exclude: set[int]) -> None:
        """SIGKILL every process of the job still alive (never one in ``exclude``)."""
        if self.cgroup is not None:
            self.cgroup.kill()
            return
        group = os.getpgid(0)
        if group != os.getpid():  # started outside a session of its own: the group is not the job's
            return
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in exclude:
                continue
            try:
                if os.getpgid(int(entry)) == group:
                    os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue

    def usage(self) -> dict[str, int]:
        """For the exit record: the job's peak host memory and out-of-memory kills."""
        return {} if self.cgroup is None else self.cgroup.usage()

    def memory_note(self) -> str | None:
        """A line for the job's stderr (and so its failure reason) when the kernel killed part
        of it at the host memory limit its owner set."""
        if self.cgroup is None or not self.cgroup.max_memory or not self.usage().get("oom_kills"):
            return None
        return (f"the kernel killed the job's processes at its host memory limit of "
                f"{self.cgroup.max_memory / 2**20:.0f} MiB (collocate serve --job-max-memory)")

    def remove(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
