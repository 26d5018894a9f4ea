"""Each attempt in a cgroup of its own: nothing it starts outlives it, and it cannot exhaust
the machine.

Why: a job's process group is not a boundary. ``nohup sleep &`` outlived a job recorded
``done``, ``setsid sleep &`` escaped a cancel, and nothing bounded a fork bomb (issue 31). A
cgroup holds every process a job starts whatever it does with sessions, so the runner can stop
the whole tree when the job ends, and the kernel enforces limits on it: a pids limit, host
memory accounted (and limited where the owner sets ``--job-max-memory``), and, as Slurm's
``ConstrainDevices`` does, no access to the GPU device files of GPUs the job was not given.

Two shapes, detected once (``Cgroups.detect``):

* **v1** (a hierarchy per controller, as on this project's dev machine): the attempt gets a
  directory in each of the ``pids``, ``memory``, ``devices`` and ``freezer`` hierarchies that is
  mounted and writable; the devices controller denies the other GPUs' device numbers, the
  freezer stops the tree while it is killed (no fork escapes the kill);
* **v2** (one unified hierarchy with controllers): one directory with ``pids.max``,
  ``memory.max``, ``memory.oom.group`` and ``cgroup.kill``. Device confinement on v2 needs a BPF
  program and is not done: the start-up line says so.

Where neither is writable (not root, a container without delegation) jobs are not confined and
``describe`` says why; the runner then stops what is left of the job's process group instead,
which ``setsid`` escapes.

The daemon prepares one parent per daemon (keyed by its state dir) at start; the runner, which
stays root, creates the attempt's cgroup, moves the job into it before the job drops its
privileges, and after the job ends kills what is left and removes it. ``AttemptCgroup`` is the
plain-data plan both sides share (the daemon uses it to signal and, if the runner died, clean up).
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

V1_CONTROLLERS = ("pids", "memory", "devices", "freezer")
V2_CONTROLLERS = ("pids", "memory")
NVIDIA_MAJOR = 195  # /dev/nvidiaN is character device 195:N (nvidiactl is 195:255)
DEFAULT_MAX_PIDS = 4096  # processes and threads of one job: a DataLoader's workers fit easily


@dataclass(frozen=True, slots=True)
class AttemptCgroup:
    """One attempt's cgroup: its directories (one per v1 hierarchy, one on v2), its limits and
    the device numbers it may not open. Plain data: it travels to the runner as JSON."""

    version: int
    dirs: dict[str, str]  # controller (v1) or "unified" (v2) -> the attempt's directory
    max_pids: int | None = DEFAULT_MAX_PIDS
    max_memory: int | None = None
    deny: tuple[tuple[int, int], ...] = ()  # (major, minor) of devices it may not open

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> AttemptCgroup:
        return cls(int(d["version"]), {str(k): str(v) for k, v in d["dirs"].items()},
                   d.get("max_pids"), d.get("max_memory"),
                   tuple((int(a), int(b)) for a, b in d.get("deny", ())))

    def _dir(self, controller: str) -> Path | None:
        d = self.dirs.get("unified" if self.version == 2 else controller)
        return None if d is None else Path(d)

    # -- the runner's side ---------------------------------------------------------------
    def create(self) -> None:
        """Make the directories and set the limits (raises OSError when it cannot)."""
        for d in self.dirs.values():
            os.makedirs(d, exist_ok=True)
        if self.version == 1:
            if self.max_pids is not None and (p := self._dir("pids")) is not None:
                _write(p / "pids.max", str(self.max_pids))
            if self.max_memory is not None and (m := self._dir("memory")) is not None:
                _write(m / "memory.limit_in_bytes", str(self.max_memory))
            if (dev := self._dir("devices")) is not None:
                for major, minor in self.deny:
                    _write(dev / "devices.deny", f"c {major}:{minor} rwm")
            return
        root = Path(self.dirs["unified"])
        if self.max_pids is not None:
            _write(root / "pids.max", str(self.max_pids))
        if self.max_memory is not None:
            _write(root / "memory.max", str(self.max_memory))
        if (root / "memory.oom.group").exists():  # the memory controller's: kill the whole job on OOM
            _write(root / "memory.oom.group", "1")

    def enter(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the calling process) into the attempt's cgroup, every hierarchy."""
        for d in self.dirs.values():
            _write(Path(d) / "cgroup.procs", str(pid or os.getpid()))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs.values():
            try:
                found |= {int(x) for x in (Path(d) / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                continue
        return found

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process in the cgroup (gone is fine)."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self, timeout_s: float = 10.0) -> bool:
        """SIGKILL every process in it, with the tree frozen (v1) or by ``cgroup.kill`` (v2), so
        no fork slips through; True once it is empty."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.version != 2 or not _write(Path(self.dirs["unified"]) / "cgroup.kill", "1",
                                               missing_ok=True):
                frozen = _freeze(self._dir("freezer"), "FROZEN")
                self.signal(signal.SIGKILL)  # a frozen process dies when thawed, without forking
                if frozen:
                    _freeze(self._dir("freezer"), "THAWED")
            if not self.pids():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def freeze(self, frozen: bool) -> bool:
        """Freeze (or thaw) every process in it: v1's freezer, v2's ``cgroup.freeze``. A frozen
        process gets no CPU and launches no kernel; its memory, host and GPU, stays. False where
        there is no freezer (then the caller stops the processes with signals)."""
        if self.version == 2:
            try:
                return _write(Path(self.dirs["unified"]) / "cgroup.freeze", "1" if frozen else "0", missing_ok=True)
            except OSError:
                return False
        return _freeze(self._dir("freezer"), "FROZEN" if frozen else "THAWED")

    def frozen(self) -> bool | None:
        """Whether it reads frozen (None: no freezer)."""
        try:
            if self.version == 2:
                return (Path(self.dirs["unified"]) / "cgroup.freeze").read_text().strip() == "1"
            freezer = self._dir("freezer")
            return None if freezer is None else (freezer / "freezer.state").read_text().strip() != "THAWED"
        except OSError:
            return None

    def usage(self) -> dict[str, int]:
        """What the kernel accounted: peak host memory (bytes) and out-of-memory kills."""
        out: dict[str, int] = {}
        memory = self._dir("memory")
        if memory is None:
            return out
        if self.version == 1:
            peak = _read_int(memory / "memory.max_usage_in_bytes")
            kills = _read_key(memory / "memory.oom_control", "oom_kill")
            if kills is None and (_read_int(memory / "memory.failcnt") or 0) and self.max_memory:
                kills = 1  # older kernels: the limit was hit
        else:
            peak = _read_int(memory / "memory.peak")
            kills = _read_key(memory / "memory.events", "oom_kill")
        if peak is not None:
            out["memory_peak_bytes"] = peak
        if kills:
            out["oom_kills"] = kills
        return out

    def remove(self) -> None:
        """Remove the (empty) directories; one still holding a process stays."""
        _rmdirs(self.dirs.values())


@dataclass
class Cgroups:
    """What this machine offers for confining jobs, and this daemon's parent cgroups."""

    version: int | None  # None: not confined
    why: str  # what is confined, or why nothing is
    parents: dict[str, str] = field(default_factory=dict)  # controller (v1) or "unified" -> dir
    max_pids: int | None = DEFAULT_MAX_PIDS
    max_memory: int | None = None

    @property
    def available(self) -> bool:
        return self.version is not None

    @classmethod
    def detect(cls, key: str, *, max_pids: int | None = DEFAULT_MAX_PIDS,
               max_memory: int | None = None, proc: Path = Path("/proc/self")) -> Cgroups:
        """Find writable cgroups and prepare this daemon's parent (``key`` names it, e.g. a
        hash of the state dir), or say why jobs cannot be confined."""
        name = "collocate-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        try:
            mounts = _mounts(proc / "mountinfo")
            own = _own_paths(proc / "cgroup")
        except OSError as exc:
            return cls(None, f"cannot read the cgroup mounts ({exc.strerror})")
        v1 = {c: m for c, m in mounts.items() if c in V1_CONTROLLERS}
        limits = dict(max_pids=max_pids, max_memory=max_memory)
        if "pids" in v1 or "memory" in v1:
            parents = {}
            for controller, mount in v1.items():
                parent = Path(mount) / own.get(controller, "/").lstrip("/") / name
                try:
                    parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    return cls(None, f"cannot create cgroups in {parent.parent} ({exc.strerror})")
                parents[controller] = str(parent)
            if "pids" not in parents:
                return cls(None, "no pids controller: a fork bomb could not be bounded")
            return cls(1, _v1_words(parents, max_pids, max_memory), parents, **limits)
        unified = mounts.get("unified")
        if unified is None:
            return cls(None, "no cgroup hierarchy is mounted")
        base = Path(unified) / own.get("unified", "/").lstrip("/")
        try:
            missing = set(V2_CONTROLLERS) - set((base / "cgroup.controllers").read_text().split())
            if missing:
                return cls(None, f"cgroup v2 without the {', '.join(sorted(missing))} controller")
            parent = _prepare_v2(base, name)
        except OSError as exc:
            return cls(None, f"cannot create cgroups under {base} ({exc.strerror or exc})")
        return cls(2, f"cgroup v2 ({_limit_words(max_pids, max_memory)}; GPU devices not "
                      "confined: cgroup v2 needs a BPF program for that)",
                   {"unified": str(parent)}, **limits)

    def describe(self) -> str:
        """For ``collocate serve``'s start-up line."""
        if self.available:
            return f"jobs confined: {self.why}"
        return (f"jobs NOT confined: {self.why} (a job's processes may outlive it and nothing "
                "bounds them; see docs/security.md)")

    def attempt(self, job_id: str, n: int, deny: tuple[tuple[int, int], ...] = ()) -> AttemptCgroup | None:
        """The cgroup of attempt ``n`` of job ``job_id`` (None when not confined)."""
        if self.version is None:
            return None
        leaf = f"job-{job_id}.{n}"
        return AttemptCgroup(self.version, {c: str(Path(p) / leaf) for c, p in self.parents.items()},
                             self.max_pids, self.max_memory, deny if self.version == 1 else ())

    def sweep(self, keep: set[str]) -> None:
        """Remove the empty attempt cgroups a previous run left behind (not those in ``keep``)."""
        for parent in self.parents.values():
            try:
                children = [e for e in os.scandir(parent) if e.is_dir() and e.name.startswith("job-")]
            except OSError:
                continue
            _rmdirs(child.path for child in children if child.name not in keep)

    def close(self) -> None:
        """Remove this daemon's parents when no attempt's cgroup is left in them."""
        _rmdirs(self.parents.values())

    @classmethod
    def remove_leftovers(cls, key: str) -> bool:
        """Remove the empty cgroups of the daemon ``key`` names, and its parents: what a daemon
        killed (not stopped) leaves behind once its jobs are gone (tests kill theirs). True when
        nothing of it is left."""
        cgroups = cls.detect(key)
        cgroups.sweep(keep=set())
        cgroups.close()
        return not any(os.path.isdir(p) for p in cgroups.parents.values())


def _rmdirs(paths: Iterable[str]) -> None:
    """Remove each cgroup directory that is empty (one holding a process stays)."""
    for path in paths:
        try:
            os.rmdir(path)
        except OSError:
            continue


def gpu_denials(given: list[int | None], all_minors: list[int | None]) -> tuple[tuple[int, int], ...]:
    """The GPU device numbers an attempt may not open: the node's GPUs it was not given."""
    mine = {m for m in given if m is not None}
    return tuple((NVIDIA_MAJOR, m) for m in sorted({m for m in all_minors if m is not None} - mine))


def _v1_words(parents: dict[str, str], max_pids: int | None, max_memory: int | None) -> str:
    words = [_limit_words(max_pids, max_memory)]
    words.append("GPU devices by the devices controller" if "devices" in parents
                 else "GPU devices not confined: no devices controller")
    if "freezer" not in parents:
        words.append("no freezer: the tree is killed without being frozen first")
    return f"cgroup v1 ({'; '.join(words)})"


def _limit_words(max_pids: int | None, max_memory: int | None) -> str:
    pids = f"at most {max_pids} processes" if max_pids else "no process limit"
    memory = ("host memory accounted, not limited" if not max_memory
              else f"host memory limited to {max_memory / 2**20:.0f} MiB")
    return f"{pids}, {memory}"


def _mounts(mountinfo: Path) -> dict[str, str]:
    """controller -> mount point of its v1 hierarchy, and ``unified`` -> the v2 mount."""
    found: dict[str, str] = {}
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point, fstype, options = fields[4], rest[0], rest[2].split(",")
        if fstype == "cgroup2":
            found.setdefault("unified", point)
        elif fstype == "cgroup":
            for option in options:
                if option in V1_CONTROLLERS:
                    found.setdefault(option, point)
    return found


def _own_paths(cgroup_file: Path) -> dict[str, str]:
    """This process's cgroup in each v1 controller, and in the unified hierarchy."""
    own: dict[str, str] = {}
    for line in cgroup_file.read_text().splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            own["unified"] = path
        for c in controllers.split(","):
            if c:
                own[c] = path
    return own


def _prepare_v2(base: Path, name: str) -> Path:
    """``base/name`` with the pids and memory controllers enabled for its children. Controllers
    pass only to a cgroup's children when it holds no process itself (v2's rule), so a daemon
    that sits in ``base`` moves itself to ``base/supervisor`` first (as a systemd service with
    ``Delegate=yes`` is expected to; its runners then start there too). Other processes in
    ``base`` are not ours to move: then jobs are not confined, and ``detect`` says why."""
    enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
    try:
        _write(base / "cgroup.subtree_control", enable)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        supervisor = base / "supervisor"
        supervisor.mkdir(exist_ok=True)
        _write(supervisor / "cgroup.procs", str(os.getpid()))
        try:
            _write(base / "cgroup.subtree_control", enable)
        except OSError as again:
            if again.errno != errno.EBUSY:
                raise
            others = len((base / "cgroup.procs").read_text().split())
            raise OSError(errno.EBUSY, f"{base} holds {others} other process(es), so its children "
                          "cannot get controllers; run the daemon in a cgroup of its own (a systemd "
                          "service with Delegate=yes)") from None
    parent = base / name
    parent.mkdir(exist_ok=True)
    _write(parent / "cgroup.subtree_control", enable)
    return parent


def _freeze(freezer: Path | None, state: str) -> bool:
    if freezer is None:
        return False
    try:
        return _write(freezer / "freezer.state", state, missing_ok=True)
    except OSError:
        return False


def _write(path: Path, text: str, *, missing_ok: bool = False) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except FileNotFoundError:
        if missing_ok:
            return False
        raise


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None
