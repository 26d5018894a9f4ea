"""What one node of a cluster does for the head: its GPUs, its jobs' processes, its files.

``NodeAgent`` owns what is local to a machine: the GPU backend (``gpus.registry.open_backend``),
the MPS control daemon when MPS runs on real GPUs, and a node-local state root holding the
attempt folders (``jobs/<id>/attempt-<n>``, the same relative path as in the head's state dir)
and emulated GPU state. It also hosts the node's shared-dataset producers (a ``daemon.datasets.Datasets``
under the node root: the head's ``NodeDatasets`` forwards to it). Every method takes and returns plain, picklable data, so the head can
call it through a Ray actor (``cluster/ray_head.py``) or in-process (the unit tests): the class
itself never imports Ray.

Runners are started *double-forked* (``_DETACH``): an intermediate shell starts the runner in
its own session and exits at once, so the runner is nobody's child here and outlives the
agent and Ray's raylet, which kill their workers' children when they exit. There is no ``Popen``
handle; the head follows each runner by pid and process start time (``runner.json``) and its
``exit.json``, exactly as a restarted single-node daemon re-adopts a runner.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from collocate.cluster.exposure import check_session_dir
from collocate.daemon import views
from collocate.daemon.confine import Confinement, signal_group
from collocate.daemon.datasets import Datasets, ProducerStartError
from collocate.daemon.executor import local_confinement, read_chunk
from collocate.daemon.isolate import CLEAN_ENV, bootstrap_argv, write_env_file
from collocate.daemon.launcher import (
    ENV_EMULATED_DIR,
    ENV_FILE,
    RUNNER_MODULE,
    LaunchPlan,
    process_matches,
    with_runner_args,
)
from collocate.daemon.paths import attempt_files
from collocate.daemon.quotas import Quotas, disk_size
from collocate.daemon.reaping import job_started
from collocate.daemon.runner import read_tail
from collocate.daemon.spec import JobSpec
from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.monitor.job_metrics import METRICS_FILE_NAME, MetricPoint, MetricsTail
from collocate.monitor.process_tree import TreeReader, TreeUsage

log = logging.getLogger("collocate.cluster")
HEARTBEAT = "agent.heartbeat"  # touched whenever the head reaches the agent (fencing)
#: The intermediate process, a shell (it starts in a millisecond where a Python takes seconds on
#: a busy node, and the agent waits for it): start the runner in the background in a session of
#: its own (``setsid`` execs it: a background job of a shell without job control is no group
#: leader, so it does not fork again), print its pid, exit. The shell's stdout and stderr are
#: the runner's logs; its stdin is the pipe the agent reads the pid from, written through fd 0
#: and never passed on (a background job's stdin is /dev/null).
_DETACH = 'setsid "$@" </dev/null & echo $! >&0'


class NodeAgent:
    """One node's side of a cluster (see the module docstring). ``rel`` arguments are an
    attempt's folder relative to the state root (``jobs/<id>/attempt-<n>``)."""

    def __init__(self, *, node: str, root: str, gpus: str, sharing: str = "time-slicing",
                 bounds: Mapping[str, Any] | None = None, fence_after_s: float | None = None) -> None:
        from collocate.gpus.registry import open_backend

        self.node, self.root = node, Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "jobs").mkdir(mode=0o700, exist_ok=True)
        self.heartbeat = self.root / HEARTBEAT
        self.beat()
        self.backend = open_backend(gpus, state_dir=self.root, node=node)
        self.confinement = self._confinement(dict(bounds or {}), fence_after_s)
        self.mps: Any = None
        if sharing == "mps" and self.backend.needs_mps_server:
            from collocate.gpus.mps import MpsControl

            self.mps = MpsControl(self.root)
            self.mps.start()
        self._trees = TreeReader()
        self._metrics = MetricsTail()  # where each job's metrics file was read up to
        self.datasets = Datasets(self.root)  # the producers of the jobs placed on this node

    def _confinement(self, bounds: dict[str, Any], fence_after_s: float | None) -> Confinement:
        """This node's bounds on its attempts: the owner's, with the disk-relative defaults taken
        of this node's disk, and the fence (``runner --fence``) on this agent's heartbeat."""
        session = bounds.pop("session_dir", None)
        if session is not None and Path(session).exists():  # Ray's folder of this node's sockets
            check_session_dir(Path(session))
        quotas = Quotas(log_max=bounds.pop("log_max", None),
                        disk_reserve=bounds.pop("disk_reserve", None)).resolved(disk_size(self.root))
        keep = {"job-{}.{}".format(*_job_and_n(rel)) for rel in self.live_runners()}
        fence = None if fence_after_s is None else (self.heartbeat, fence_after_s)
        return local_confinement(str(self.root), self.backend.devices(), log_max=quotas.log_max or 0,
                                 disk_reserve=quotas.disk_reserve or 0, keep=keep, fence=fence,
                                 max_pids=bounds.get("max_pids"), max_memory=bounds.get("max_memory"))

    def beat(self) -> None:
        """The head reached this agent now: runners fence on this file's age."""
        self.heartbeat.touch()

    def confinement_words(self) -> str:
        return self.confinement.cgroups.describe()

    def hello(self) -> tuple[list[DeviceInfo], str]:
        """What the head asks a new agent once it has started: its GPUs, how it confines jobs."""
        return self.devices(), self.confinement_words()

    # -- GPUs ------------------------------------------------------------------------------
    def ping(self) -> str:
        return self.node

    def devices(self) -> list[DeviceInfo]:
        return self.backend.devices()

    def sample(self) -> list[DeviceSample]:
        return self.backend.sample()

    def tick(self, runners: list[tuple[int, float]]) -> tuple[list[DeviceSample], list[tuple[int, float]]]:
        """A round's one call: the samples, and which of ``runners`` (pid, start time) still run."""
        self.beat()
        return self.backend.sample(), [r for r in runners if process_matches(*r)]

    # -- runners ---------------------------------------------------------------------------
    def start(self, plan: LaunchPlan, head_root: str, job_id: str, n: int) -> tuple[int, float]:
        """Start attempt ``n`` of job ``job_id``'s runner double-forked, with this node's bounds;
        ``(pid, process start time)``."""
        self.beat()
        uuids = plan.env.get("CUDA_VISIBLE_DEVICES", "").split(",")
        plan = localize(plan, head_root, str(self.root), self.backend.emulated_state_dir)
        plan = with_runner_args(plan, *self.confinement.runner_args(job_id, n, uuids))
        plan.dir.mkdir(parents=True, exist_ok=True)
        files = attempt_files(plan.dir)
        write_env_file(plan.dir / ENV_FILE, plan.env)
        read_end, write_end = os.pipe()
        try:
            with _open_log(files["stdout"]) as out, _open_log(files["stderr"]) as err:
                middle = subprocess.Popen(["/bin/sh", "-c", _DETACH, "sh", *plan.argv],
                                          cwd=plan.dir, env=dict(CLEAN_ENV), stdin=write_end,
                                          stdout=out, stderr=err, start_new_session=True)
            os.close(write_end)
            write_end = -1
            with os.fdopen(read_end, "rb") as pipe:
                read_end = -1
                text = pipe.read().decode().strip()
            middle.wait(timeout=60)
        finally:
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
        if not text.isdigit():
            raise OSError(f"could not start the runner on node {self.node} "
                          f"(see {files['stderr']} there)")
        pid = int(text)
        _wait_own_group(pid)
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            started = 0.0  # exited already; the exit record tells the rest
        return pid, started

    def poll(self, pid: int | None, started: float | None) -> bool:
        return process_matches(pid, started)

    def signal(self, pid: int | None, sig: int, job_id: str, n: int) -> None:
        self.confinement.signal(job_id, n, pid, sig)

    def release(self, job_id: str, n: int) -> None:
        self.confinement.release(job_id, n)

    def exit_record(self, rel: str) -> dict[str, Any] | None:
        return views.read_exit(self._dir(rel))

    def started_record(self, rel: str) -> dict[str, Any] | None:
        return views.read_json(attempt_files(self._dir(rel))["started"])

    def stderr_tail(self, rel: str) -> str:
        return read_tail(attempt_files(self._dir(rel))["stderr"])

    def job_started(self, rel: str) -> bool:
        return job_started(self._dir(rel))

    def read_log(self, rel: str, stream: str, offset: int, limit: int) -> bytes:
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"no log stream {stream!r}")
        return read_chunk(attempt_files(self._dir(rel))[stream], offset, limit)

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        return self._trees.read(roots, now, gpu_pids)

    def read_metrics(self, attempts: Mapping[str, str]) -> list[MetricPoint]:
        """The new ``log_metric`` points of these jobs (``job_id → rel``) since the last call;
        files of jobs no longer asked about are closed."""
        return self._metrics.read({job_id: self._dir(rel) / METRICS_FILE_NAME
                                   for job_id, rel in attempts.items()})

    # -- after a partition or a head restart -----------------------------------------------
    def live_runners(self) -> dict[str, tuple[int, float]]:
        """The attempts whose runner still runs here (``rel → (pid, start time)``), from the
        records on this node's disk: ``runner.json`` and no ``exit.json``."""
        live = {}
        for record in self.root.glob("jobs/*/attempt-*/runner.json"):
            adir = record.parent
            if views.read_exit(adir) is not None:
                continue
            started = views.read_json(record)
            if not started:
                continue
            pid, at = int(started.get("pid", 0)), float(started.get("started", 0.0))
            if process_matches(pid, at):
                live[str(adir.relative_to(self.root))] = (pid, at)
        return live

    def stop_unowned(self, owned: AbstractSet[str]) -> list[str]:
        """SIGKILL the process group of every live runner the head does not own (its attempt
        was recorded lost and requeued while this node was away): nothing runs twice."""
        stopped = []
        for rel, (pid, _) in sorted(self.live_runners().items()):
            if rel not in owned:
                signal_group(pid, signal.SIGKILL)
                self.confinement.release(*_job_and_n(rel))
                stopped.append(rel)
        return stopped

    # -- shared datasets (the head's ``NodeDatasets``) ----------------------------------------
    def datasets_ensure(self, spec: JobSpec) -> tuple[bool, str | None, dict[str, str], dict[str, int]]:
        """``Datasets.ensure`` here: (ready, why its producer failed or None, the environment
        its jobs get, this node's producers by name)."""
        try:
            ready, error = self.datasets.ensure(spec), None
        except ProducerStartError as exc:  # a message, not an exception, crosses to the head
            ready, error = False, str(exc)
        assert spec.dataset is not None
        return ready, error, self.datasets.job_env(spec.dataset), self._producers()

    def datasets_reconcile(self, wanted: AbstractSet[str], known: AbstractSet[str]) -> dict[str, int]:
        """``Datasets.reconcile`` here, after adopting the producers of ``known`` (those the
        head was last told run here) that this agent does not follow: a new agent, after its
        node was away, stops what an earlier one started once no job needs it."""
        self.datasets.adopt(known)
        self.datasets.reconcile(wanted)
        return self._producers()

    def datasets_adopt(self, names: AbstractSet[str]) -> dict[str, int]:
        self.datasets.adopt(names)
        return self._producers()

    def _producers(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.datasets.producers.items()}

    def close(self) -> None:
        self._metrics.close()
        self.datasets.close()
        self.confinement.cgroups.close()
        if self.mps is not None:
            self.mps.stop()
        self.backend.close()

    def _dir(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve() / "jobs"):
            raise ValueError(f"attempt folder {rel!r} is outside this node's jobs/")
        return path


def _job_and_n(rel: str) -> tuple[str, int]:
    """``jobs/<id>/attempt-<n>`` → ``(id, n)``."""
    parts = Path(rel).parts
    return parts[1], int(parts[2].removeprefix("attempt-"))


def _wait_own_group(pid: int, timeout_s: float = 10.0) -> None:
    """Until the runner leads its process group (``setsid`` ran), so a signal to the group
    right after the start reaches it; or it has exited already."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return
        time.sleep(0.001)


def localize(plan: LaunchPlan, head_root: str, node_root: str,
             emulated_dir: Path | None) -> LaunchPlan:
    """The head's plan as this node runs it: paths under the head's state dir moved to the
    node's root (attempt folder, log and metrics files, MPS directories), this node's runner
    installation, and this node's emulated GPU state (or none)."""

    def move(text: str) -> str:
        if text == node_root or text.startswith(node_root + os.sep):
            return text  # the node's already (a dataset's share dir, under the head's root)
        if text == head_root or text.startswith(head_root + os.sep):
            return node_root + text[len(head_root):]
        return text

    if RUNNER_MODULE not in plan.argv:
        raise ValueError("not a runner's launch plan")
    tail = plan.argv[plan.argv.index(RUNNER_MODULE) + 1:]
    env = {k: move(v) for k, v in plan.env.items()}
    env.pop(ENV_EMULATED_DIR, None)
    if emulated_dir is not None:
        env[ENV_EMULATED_DIR] = str(emulated_dir)
    return replace(plan, argv=(*bootstrap_argv(RUNNER_MODULE), *(move(a) for a in tail)),
                   env=env, dir=Path(move(str(plan.dir))))


def _open_log(path: Path):
    """Append-only, never through a symlink, private to the agent's user."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab")
