"""The daemon as the head of a Ray cluster: one ``NodeAgent`` actor per node, behind the seams.

The only module that imports Ray (lazily, from ``collocate serve --ray``). Everything else of the
daemon (queue, core, policies, SQLite, API, dashboard) is today's; this module gives it

* ``ClusterBackend`` (a ``GpuBackend``): the union of the agents' devices; one parallel
  ``ray.get`` per round for the samples, with a timeout. A node that does not answer reports its
  GPUs as full and unreachable (never as free), and the policies' snapshot leaves them out, so
  nothing is placed there while it is away;
* ``ClusterExecutor`` (an ``Executor``): each call forwarded to the agent of the attempt's node
  (the node is in the attempt's GPUs, ``node:index``). An attempt on a node that stops answering
  stays unconfirmed (alive) for ``grace_s``; after it, the attempt ends as *lost* (requeued,
  without using up an attempt). A node that comes back gets a new agent, and every runner on it
  the head no longer owns is stopped, so nothing runs twice after a partition. It also reads the
  jobs' metrics files on their nodes, and gives the loop each node's ``--dataset`` producers as a
  ``NodeDatasets`` (the agent's ``Datasets``, forwarded).

Agents are asked for no GPUs and no CPUs (``num_gpus=0, num_cpus=0``): collocate keeps its own GPU
accounting and sets ``CUDA_VISIBLE_DEVICES`` itself. Nodes are those whose raylet carries the
``collocate`` resource; a node's name is its ``collocate-node`` label (``ray start --labels
collocate-node=NAME``), else its hostname.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from collocate.cluster.agent import NodeAgent
from collocate.cluster.exposure import check_session_dir, require_token
from collocate.daemon.datasets import ProducerStartError
from collocate.daemon.executor import MachineUnreachable
from collocate.daemon.launcher import LaunchPlan
from collocate.daemon.store import Attempt
from collocate.errors import CollocateError
from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.model import GpuId
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.process_tree import TreeUsage

log = logging.getLogger("collocate.daemon")
RESOURCE = "collocate"  # the custom resource that marks a node as collocate's
NAME_LABEL = "collocate-node"  # the label that names a node (else its hostname)
CALL_TIMEOUT_S = 10.0  # one call to one agent
SAMPLE_TIMEOUT_S = 1.0  # the round's parallel sample: the loop answers requests between rounds
#: An attempt of a silent node is lost after the grace period plus this: its runner stops the
#: job once the agent's heartbeat is ``grace`` old (it checks 4 times a second), so the job is
#: gone before it is requeued elsewhere (fencing; the heartbeat is never newer than the head's
#: last answer from the node).
FENCE_MARGIN_S = 2.0
BEAT_S = 0.5  # how often the head reaches every answering agent (``Agents._beat``)
REFRESH_S = 5.0  # how often the head looks for nodes that (re)joined
AGENT_START_S = 120.0  # how long a new agent may take to answer


class NodeDown(Exception):
    """The node's agent did not answer (dead, partitioned or not started)."""


@dataclass
class Seat:
    """One node's agent as the head knows it."""

    name: str
    node_id: str
    actor: Any
    down_since: float | None = None
    reconcile: bool = True  # stop the runners the head does not own at the next ``collect``
    agent_died: bool = False  # its actor is gone: a new agent is due once the raylet lives


class Agents:
    """The agent actors by node name: starts them, calls them, notices nodes leave and return."""

    def __init__(self, *, gpus: str, sharing: str, state_dir: Path,
                 bounds: dict[str, Any] | None = None, fence_after_s: float | None = None) -> None:
        self.gpus, self.sharing, self.state_dir = gpus, sharing, state_dir
        self.bounds, self.fence_after_s = bounds or {}, fence_after_s  # each agent's (agent.py)
        self.confinement: dict[str, str] = {}  # node → how its jobs are confined
        self.seats: dict[str, Seat] = {}
        self.known: dict[str, list[DeviceInfo]] = {}  # devices of every node seen since start
        # Runners (pid, start time) to check at the next sample, by node, and this round's answers:
        # the round polls every runner with the samples, one parallel call, not one call each.
        self.to_check: dict[str, set[tuple[int, float]]] = {}
        self.checked: dict[str, tuple[set, set]] = {}  # node → (asked, alive)
        self.since = time.time()  # nodes not seen yet count as down from the head's start
        self._refreshed = 0.0
        self._pinging: dict[str, Any] = {}  # node → the ping of its silent agent, not waited for
        self._starting: dict[str, tuple[str, Any, Any, float]] = {}  # node → (id, actor, hello, since)
        self._started = False  # after the first look, a node not seen yet joined late
        self.refresh(force=True)
        self._started = True
        self._stop_beating = threading.Event()
        threading.Thread(target=self._beat, name="agent-heartbeats", daemon=True).start()

    def _beat(self) -> None:
        """Reach every answering agent every ``BEAT_S`` (``NodeAgent.beat``), from a thread of
        its own: runners fence on that heartbeat, so a head whose loop is held up (seating an
        agent, a slow call) must not look lost to them. A node marked down gets none: its
        runners stop their jobs before the grace period (and ``FENCE_MARGIN_S``) requeue them."""
        while not self._stop_beating.wait(BEAT_S):
            for seat in list(self.seats.values()):
                if seat.down_since is None:
                    seat.actor.beat.remote()  # fire and forget: a lost node's just fail

    def nodes(self) -> dict[str, str]:
        """Alive nodes carrying the ``collocate`` resource: name → Ray node id."""
        found: dict[str, str] = {}
        for n in ray.nodes():
            if not n.get("Alive") or n.get("Resources", {}).get(RESOURCE, 0) <= 0:
                continue
            name = (n.get("Labels") or {}).get(NAME_LABEL) or n.get("NodeManagerHostname", "")
            if not name or any(c in name for c in ":/ ") or name in found:
                raise CollocateError(
                    f"two collocate nodes are named {name!r}, or the name has ':', '/' or ' '",
                    hint=f"start each node with `ray start ... --labels {NAME_LABEL}=NAME` "
                         "and a unique NAME")
            found[name] = n["NodeID"]
        return found

    def refresh(self, *, force: bool = False) -> None:
        """Start an agent on each node that joined, or came back, since the last look (every
        ``REFRESH_S``), and, every round, see whether a silent agent answers again. Nothing here
        waits on a node (the loop answers requests between rounds): a ping of a silent agent, or
        a new agent's start, is sent at one call and its answer taken at a later one. ``force``
        (the head's start) waits for the new agents."""
        self._seat_started(wait=False)
        self._recheck_silent()
        now = time.time()
        if not force and now - self._refreshed < REFRESH_S:
            return
        self._refreshed = now
        for name, node_id in self.nodes().items():
            seat = self.seats.get(name)
            if name in self._starting or (seat is not None and seat.node_id == node_id
                                          and not seat.agent_died):
                continue  # seated, being started, or silent on a live raylet (``_recheck_silent``)
            self._start(name, node_id)
        self._seat_started(wait=force)

    def _recheck_silent(self) -> None:
        """Ping each silent agent (one ping out at a time, never waited for): one that answers
        is back (its node's GPUs and heartbeat return at once, so a head that was only slow to
        hear it does not fence its jobs for long), one found dead is replaced at the next look."""
        for name, seat in list(self.seats.items()):
            if seat.down_since is None or seat.agent_died:
                continue
            ref = self._pinging.pop(name, None)
            if ref is None or not ray.wait([ref], timeout=0)[0]:
                self._pinging[name] = ref if ref is not None else seat.actor.ping.remote()
                continue
            try:
                ray.get(ref)
            except ActorDiedError:
                seat.agent_died = True
                continue
            except RayError:
                continue
            seat.down_since = None
            log.warning("node %s answers again", name)

    def _start(self, name: str, node_id: str) -> None:
        remote: Any = ray.remote(NodeAgent)
        actor: Any = remote.options(
            num_cpus=0, num_gpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            # Ray starts workers niced (15); the agent's runners and jobs would inherit it and
            # starve beside any busy process. Ray's job supervisor asks for 0 the same way.
            # A worker that exits kills its direct children: the agent's dataset producers
            # (runners are double-forked) must outlive it, as they outlive a single-node daemon.
            runtime_env={"env_vars": {"RAY_worker_niceness": "0",
                                      "RAY_kill_child_processes_on_worker_exit": "0"}},
        ).remote(node=name, root=str(self.state_dir / "nodes" / name), gpus=self.gpus,
                 sharing=self.sharing, bounds=self.bounds, fence_after_s=self.fence_after_s)
        self._starting[name] = (node_id, actor, actor.hello.remote(), time.monotonic())

    def _seat_started(self, *, wait: bool) -> None:
        """Seat the agents started earlier that have answered (all of them, with ``wait``)."""
        for name, (node_id, actor, hello, since) in list(self._starting.items()):
            left = AGENT_START_S - (time.monotonic() - since)
            if not ray.wait([hello], timeout=max(0.0, left) if wait else 0)[0] and left > 0:
                continue
            del self._starting[name]
            try:
                devices, self.confinement[name] = ray.get(hello, timeout=0)
            except (RayError, GetTimeoutError) as exc:
                log.error("node %s: its collocate agent did not start: %s", name, exc)
                ray.kill(actor)
                continue
            self._seat(name, node_id, actor, devices)

    def _seat(self, name: str, node_id: str, actor: Any, devices: list[DeviceInfo]) -> None:
        self._pinging.pop(name, None)
        old = self.seats.get(name)
        if old is not None:
            ray.kill(old.actor)
            log.warning("node %s is back: new agent; runners the head no longer owns will be stopped", name)
        if self._started and name not in self.known:
            log.warning("node %s joined after the head started; restart the head to use its GPUs", name)
        known = self.known.setdefault(name, devices)
        if [d.uuid for d in known] != [d.uuid for d in devices]:
            log.error("node %s came back with other GPUs (%d); restart the head to use them",
                      name, len(devices))
        self.seats[name] = Seat(name, node_id, actor)

    def call(self, name: str, method: str, *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        seat = self.seats.get(name)
        if seat is None or seat.down_since is not None:
            raise NodeDown(name)
        try:
            return ray.get(getattr(seat.actor, method).remote(*args), timeout=timeout)
        except RayTaskError as exc:  # the agent answered, with an error of its own (a full disk...)
            raise exc.as_instanceof_cause() from None
        except RayError as exc:
            self.mark_down(name, exc)
            raise NodeDown(name) from exc

    def call_all(self, method: str, per_node: Mapping[str, tuple] | None = None,
                 timeout: float = SAMPLE_TIMEOUT_S) -> dict[str, Any]:
        """One call on every answering agent at once (``per_node``: its arguments, and only
        those nodes); the answers of those that answered in time."""
        refs = {}
        for name, seat in self.seats.items():
            if seat.down_since is None and (per_node is None or name in per_node):
                args = () if per_node is None else per_node[name]
                refs[name] = getattr(seat.actor, method).remote(*args)
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout) if refs else ([], [])
        answers = {}
        for name, ref in refs.items():
            if ref not in ready:
                self.mark_down(name, "no answer in time")
                continue
            try:
                answers[name] = ray.get(ref)
            except RayError as exc:
                self.mark_down(name, exc)
        return answers

    def mark_down(self, name: str, why: Any) -> None:
        seat = self.seats.get(name)
        if seat is not None and seat.down_since is None:
            seat.down_since = time.time()
            log.warning("node %s stopped answering (%s); its GPUs count as full", name, why)

    def down_for(self, name: str, now: float) -> float:
        """How long ``name`` has not answered (0 while it answers)."""
        seat = self.seats.get(name)
        if seat is None:
            return now - self.since
        return 0.0 if seat.down_since is None else now - seat.down_since

    def close(self) -> None:
        self._stop_beating.set()
        for seat in self.seats.values():
            try:
                ray.get(seat.actor.close.remote(), timeout=SAMPLE_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                pass
            ray.kill(seat.actor)


    def tick(self) -> dict[str, list[DeviceSample]]:
        """Each answering node's samples; its runners in ``to_check`` checked in the same call."""
        asked = {name: sorted(self.to_check.pop(name, ())) for name in self.seats}
        answers = self.call_all("tick", {name: (runners,) for name, runners in asked.items()})
        self.checked = {name: (set(asked[name]), set(alive)) for name, (_, alive) in answers.items()}
        return {name: samples for name, (samples, _) in answers.items()}

    def check_next_tick(self, name: str, runner: tuple[int, float]) -> None:
        self.to_check.setdefault(name, set()).add(runner)


class ClusterBackend:
    """Every node's GPUs as one backend (see the module docstring)."""

    name = "ray"
    emulated_state_dir = None  # each agent sets its node's own for its jobs
    needs_mps_server = False  # each agent starts its node's own

    def __init__(self, agents: Agents) -> None:
        self.agents = agents
        self.nodes = sorted(agents.known)  # the daemon's GPUs are those of the nodes at its start

    def devices(self) -> list[DeviceInfo]:
        return [d for name in self.nodes for d in self.agents.known[name]]

    def sample(self) -> list[DeviceSample]:
        try:
            self.agents.refresh()
        except (RayError, CollocateError, ConnectionError) as exc:  # e.g. Ray's GCS is down
            log.warning("cannot look for returning nodes: %s", exc)
        answers = self.agents.tick()
        now = time.time()
        samples: list[DeviceSample] = []
        for name in self.nodes:
            if name in answers:
                samples.extend(answers[name])
            else:  # away: full, so nothing is placed there
                samples.extend(DeviceSample(d.uuid, now, d.total_mib, 0.0, reachable=False)
                               for d in self.agents.known[name])
        return samples

    def close(self) -> None:
        self.agents.close()


class ClusterExecutor:
    """The daemon's ``Executor`` on a Ray cluster: each call goes to the attempt's node."""

    def __init__(self, agents: Agents, head_root: Path, *, grace_s: float) -> None:
        self.agents, self.head_root, self.grace_s = agents, head_root, grace_s
        self._owned: set[tuple[str, str]] = set()  # (node, rel) polled or started since the last collect
        self._datasets: dict[str, NodeDatasets] = {}
        self._metrics_nodes: set[str] = set()  # nodes asked for metrics last tick

    def _where(self, attempt: Attempt) -> tuple[str, str]:
        node = GpuId.parse(attempt.gpus[0]).node
        return node, str(Path(attempt.dir).relative_to(self.head_root))

    def start(self, plan: LaunchPlan, attempt: Attempt) -> tuple[Any, int, float]:
        node, rel = self._where(attempt)
        try:
            pid, started = self.agents.call(node, "start", plan, str(self.head_root), attempt.job_id,
                                            attempt.n, timeout=60)
        except NodeDown:
            raise MachineUnreachable(f"node {node} did not answer") from None
        self._owned.add((node, rel))
        self.agents.check_next_tick(node, (pid, started))
        return None, pid, started

    def poll(self, handle: Any, attempt: Attempt) -> tuple[bool, int | None]:
        """From this round's samples when they checked the runner, else asked now."""
        node, rel = self._where(attempt)
        runner = (attempt.pid or 0, attempt.pid_started or 0.0)
        asked, alive_ones = self.agents.checked.get(node, ((), ()))
        if runner in asked:
            alive = runner in alive_ones
        else:
            try:
                alive = self.agents.call(node, "poll", attempt.pid, attempt.pid_started)
            except NodeDown:  # unconfirmed: alive until the grace period is over (and the
                # runner had FENCE_MARGIN_S to stop the job: it fences at ``grace_s``)
                alive = self.agents.down_for(node, time.time()) < self.grace_s + FENCE_MARGIN_S
        if alive:
            self._owned.add((node, rel))
            self.agents.check_next_tick(node, runner)
        return alive, None

    def matches(self, attempt: Attempt) -> bool:
        """At a head restart: a runner on a node that does not answer is taken as alive, and
        followed by ``poll`` through the grace period."""
        node, _ = self._where(attempt)
        try:
            return bool(self.agents.call(node, "poll", attempt.pid, attempt.pid_started))
        except NodeDown:
            return True

    def signal(self, attempt: Attempt, sig: int) -> None:
        node, _ = self._where(attempt)
        try:
            self.agents.call(node, "signal", attempt.pid, sig, attempt.job_id, attempt.n)
        except NodeDown:
            pass  # a node that comes back stops what the head no longer owns

    def release(self, attempt: Attempt) -> None:
        node, _ = self._where(attempt)
        try:
            self.agents.call(node, "release", attempt.job_id, attempt.n)
        except NodeDown:
            pass  # its runner fenced the job; a returning node stops what the head does not own

    def confinement_words(self) -> str:
        return "; ".join(f"{name}: {words}" for name, words in sorted(self.agents.confinement.items()))

    def close(self) -> None:
        pass  # each agent removes its cgroups when it closes

    def exit_record(self, attempt: Attempt) -> dict[str, Any] | None:
        node, rel = self._where(attempt)
        try:
            return self.agents.call(node, "exit_record", rel)
        except NodeDown:
            return {"lost": f"its node {node} stopped answering for over {self.grace_s:g} s; requeued"}

    def _read(self, attempt: Attempt, method: str, *args: Any, default: Any) -> Any:
        node, rel = self._where(attempt)
        try:
            return self.agents.call(node, method, rel, *args)
        except NodeDown:
            return default

    def started_record(self, attempt: Attempt) -> dict[str, Any] | None:
        return self._read(attempt, "started_record", default=None)

    def stderr_tail(self, attempt: Attempt) -> str:
        return self._read(attempt, "stderr_tail", default="")

    def job_started(self, attempt: Attempt) -> bool:
        return self._read(attempt, "job_started", default=False)

    def read_log(self, attempt: Attempt, stream: str, offset: int, limit: int) -> bytes:
        return self._read(attempt, "read_log", stream, offset, limit, default=b"")

    def adopt_orphan(self, attempt: Attempt) -> Any | None:
        return None  # runners are double-forked: no agent is their parent

    def is_orphan(self, handle: Any) -> bool:
        return False

    def read_trees(self, roots: Mapping[str, Attempt], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        per_node: dict[str, dict[str, int]] = {}
        for job_id, attempt in roots.items():
            per_node.setdefault(self._where(attempt)[0], {})[job_id] = attempt.pid or 0
        answers = self.agents.call_all("read_trees", {n: (r, now, frozenset(gpu_pids))
                                                      for n, r in per_node.items()})
        return {job_id: tree for trees in answers.values() for job_id, tree in trees.items()}

    def datasets_of(self, attempt: Attempt) -> NodeDatasets:
        return self._node_datasets(self._where(attempt)[0])

    def remote_datasets(self) -> list[NodeDatasets]:
        return [self._node_datasets(name) for name in sorted(self.agents.seats)]

    def _node_datasets(self, node: str) -> NodeDatasets:
        if node not in self._datasets:
            self._datasets[node] = NodeDatasets(self.agents, node)
        return self._datasets[node]

    def read_metrics(self, attempts: Mapping[str, Attempt]) -> list[MetricPoint]:
        """Each node reads its jobs' metrics files; a node whose jobs all ended is asked once
        more, with none, so it closes their files."""
        per_node: dict[str, dict[str, str]] = {name: {} for name in self._metrics_nodes}
        for job_id, attempt in attempts.items():
            node, rel = self._where(attempt)
            per_node.setdefault(node, {})[job_id] = rel
        self._metrics_nodes = {name for name, jobs in per_node.items() if jobs}
        if not per_node:
            return []
        answers = self.agents.call_all("read_metrics", {n: (jobs,) for n, jobs in per_node.items()})
        return [point for points in answers.values() for point in points]

    def collect(self, keep: set[int]) -> None:
        """Once per round, after the attempts were polled: on each new agent, stop the runners
        the head does not own (their attempts were recorded lost while the node was away)."""
        for name, seat in list(self.agents.seats.items()):
            if not seat.reconcile or seat.down_since is not None:
                continue
            owned = {rel for node, rel in self._owned if node == name}
            try:
                stopped = self.agents.call(name, "stop_unowned", owned)
            except NodeDown:
                continue
            seat.reconcile = False
            for rel in stopped:
                log.warning("node %s: stopped %s, which the head no longer owns", name, rel)
        self._owned.clear()


class NodeDatasets:
    """One node's ``Datasets`` (its agent's) as the daemon's loop uses it: each call forwarded,
    so a job's producer runs on the job's node. ``producers`` is what the agent last reported
    (name → pid): the loop reconciles only nodes that have some."""

    def __init__(self, agents: Agents, node: str) -> None:
        self.agents, self.node = agents, node
        self.producers: dict[str, int] = {}
        self._env: dict[str, dict[str, str]] = {}  # a ready dataset's job environment, by name

    def ensure(self, spec: Any) -> bool:
        try:
            ready, error, env, self.producers = self.agents.call(self.node, "datasets_ensure", spec,
                                                                 timeout=60)
        except NodeDown:  # not the job's fault: its attempt is lost and the job requeued
            raise MachineUnreachable(f"node {self.node} did not answer") from None
        if error is not None:
            raise ProducerStartError(error)
        self._env[spec.dataset] = env
        return ready

    def job_env(self, name: str) -> dict[str, str]:
        return self._env[name]  # asked right after ``ensure`` said ready

    def reconcile(self, wanted: Any) -> None:
        try:
            self.producers = self.agents.call(self.node, "datasets_reconcile", frozenset(wanted),
                                              frozenset(self.producers))
        except NodeDown:
            pass  # asked again next round

    def adopt(self, names: Any) -> None:
        try:
            self.producers = self.agents.call(self.node, "datasets_adopt", frozenset(names))
        except NodeDown:
            pass  # its producers are started again when its next job launches


def open_cluster(config: Any) -> tuple[ClusterBackend, ClusterExecutor]:
    """Connect to the Ray cluster at ``config.ray`` (``auto``: the local one) and seat an agent on
    every collocate node."""
    try:
        ray.init(address=config.ray, namespace="collocate", logging_level=logging.WARNING,
                 log_to_driver=False)
    except (ConnectionError, RayError, ValueError) as exc:
        raise CollocateError(f"cannot connect to the Ray cluster at {config.ray!r}: {exc}",
                             hint="start it first (`ray start --head ...`, see docs/multi-node.md), "
                                  "or pass its address, e.g. --ray 10.0.0.1:6379") from exc
    try:  # before any agent runs: a cluster open to all, or with an open session folder, is refused
        require_token(ray.get_runtime_context().gcs_address)
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        check_session_dir(session)
    except CollocateError:
        ray.shutdown()
        raise
    bounds = dict(max_pids=config.job_max_pids, max_memory=config.job_max_memory,
                  log_max=config.quotas.log_max, disk_reserve=config.quotas.disk_reserve,
                  session_dir=str(session))
    agents = Agents(gpus=config.gpus, sharing=config.sharing.value, state_dir=config.state_dir,
                    bounds=bounds, fence_after_s=config.node_grace_s)
    if not agents.seats:
        raise CollocateError(f"no node of the Ray cluster carries the {RESOURCE!r} resource",
                             hint=f"start each GPU node with `ray start --resources '{{\"{RESOURCE}\": 1}}' "
                                  f"--labels {NAME_LABEL}=NAME ...` (docs/multi-node.md)")
    log.info("Ray cluster: %d node(s): %s", len(agents.seats), ", ".join(sorted(agents.seats)))
    return ClusterBackend(agents), ClusterExecutor(agents, config.state_dir, grace_s=config.node_grace_s)

