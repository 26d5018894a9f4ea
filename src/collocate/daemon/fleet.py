"""The head's door to its nodes: every attempt's parts, wherever they run.

The daemon's loop never touches a job's processes; it asks the ``Fleet``, which forwards each
question about an attempt to the node of each of its parts through the ``Node`` API
(``collocate.node.api``). The nodes are a ``Nodes``: ``InProcessNodes`` for one server (a
``LocalNode`` in the daemon's own process, no Ray imported) or ``cluster.ray_head.RayNodes`` for
a Ray cluster (one agent actor per node). The Fleet is also the GPU backend the daemon's
``GpuWatch`` reads: each round one ``tick`` per node gives its GPU readings and whether its
parts' runners still run.

An attempt has one part per node (rank order = the order of its GPUs' nodes). The rules of a
multi-part attempt (a gang across nodes) live here, one place for every kind of node:

* it runs while every part runs, or while the parts that ended all ended well;
* a part that fails ends the attempt: the other parts are stopped (SIGKILL);
* a node that does not answer keeps its parts *unconfirmed* (running) for ``grace_s`` plus
  ``FENCE_MARGIN_S`` (its runners stop their jobs at ``grace_s`` without the head: fencing);
  after that the attempt ends *lost*, the other parts are stopped, and the job is requeued
  without using up an attempt. A part that fails while a node of the attempt is silent is taken
  for a consequence of that node's loss (the peers of a collective lose their rank), so the
  attempt waits for the grace period and ends lost too.

A freeze or thaw (``suspend``) that a silent node did not get is owed to it, and told once it
answers again (the next ``sample``): the head's record of a job as frozen or not never stays
untrue on a node that comes back within its grace period.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from collocate.daemon.store import Attempt
from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.process_tree import TreeUsage
from collocate.node.api import ExitRecord, Node, NodeTick, NodeUnreachable, PartEnd, PartRef, PartStatus
from collocate.node.datasets import ProducerRequest, ProducerStartError
from collocate.node.launcher import LaunchPlan

log = logging.getLogger("collocate.daemon")
#: An attempt of a silent node is lost after the grace period plus this: its runners stop the
#: job once the agent's heartbeat is ``grace`` old (they check 4 times a second), so the job is
#: gone before it is requeued elsewhere.
FENCE_MARGIN_S = 2.0


class Nodes(Protocol):
    """The head's nodes by name: who they are, calls fanned out to several at once, and the
    membership (nodes that join, leave and come back)."""

    kind: str  # what they are ("ray", or one in-process node's GPU backend)
    generation: int  # counts the times a node was seated: the head then asks for its GPUs

    def names(self) -> list[str]:
        """Every node seated now, answering or not, in a stable order."""
        ...

    def node(self, name: str) -> Node:
        """The node to call; raises ``NodeUnreachable`` when it is not seated or does not answer."""
        ...

    def down_for(self, name: str, now: float) -> float:
        """How long ``name`` has not answered (0 while it answers)."""
        ...

    def refresh(self) -> None:
        """Seat nodes that joined or came back; notice those that left (never waits on one)."""
        ...

    def tick(self, parts: Mapping[str, Sequence[PartRef]]) -> dict[str, NodeTick]:
        """One ``tick`` on every answering node at once; the answers of those that answered."""
        ...

    def read_trees(self, roots: Mapping[str, Mapping[str, int]], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, dict[str, TreeUsage]]: ...

    def read_metrics(self, parts: Mapping[str, Mapping[str, PartRef]]) -> dict[str, list[MetricPoint]]: ...

    def confinement_words(self) -> str: ...

    def close(self) -> None: ...


class InProcessNodes:
    """Nodes in the head's own process (one server's ``LocalNode``; fakes in tests and
    benchmarks): always answering, called one after another."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = {n.name: n for n in nodes}
        backend = getattr(nodes[0], "backend", None) if len(nodes) == 1 else None
        self.kind = backend.name if backend is not None else f"{len(nodes)} in-process nodes"
        self.generation = 0

    def add(self, node: Node) -> None:
        """A node that joined (tests and benchmarks of elastic membership)."""
        self.nodes[node.name] = node
        self.generation += 1

    def names(self) -> list[str]:
        return list(self.nodes)

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise NodeUnreachable(f"no node {name!r}") from None

    def down_for(self, name: str, now: float) -> float:
        return 0.0 if name in self.nodes else float("inf")

    def refresh(self) -> None:
        pass

    def tick(self, parts: Mapping[str, Sequence[PartRef]]) -> dict[str, NodeTick]:
        return {name: node.tick(parts.get(name, ())) for name, node in self.nodes.items()}

    def read_trees(self, roots: Mapping[str, Mapping[str, int]], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, dict[str, TreeUsage]]:
        return {name: self.nodes[name].read_trees(r, now, gpu_pids) for name, r in roots.items()}

    def read_metrics(self, parts: Mapping[str, Mapping[str, PartRef]]) -> dict[str, list[MetricPoint]]:
        return {name: self.nodes[name].read_metrics(p) for name, p in parts.items()}

    def confinement_words(self) -> str:
        if len(self.nodes) == 1:
            return next(iter(self.nodes.values())).confinement_words()
        return "; ".join(f"{name}: {n.confinement_words()}" for name, n in sorted(self.nodes.items()))

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


@dataclass(frozen=True, slots=True)
class Part:
    """One part of an attempt as the head follows it: its node and its ``PartRef``."""

    node: str
    ref: PartRef


def parts_of(attempt: Attempt) -> tuple[Part, ...]:
    """The attempt's parts in rank order (one per node of its GPUs)."""
    nodes = attempt.nodes
    runners = attempt.runners or ((attempt.pid, attempt.pid_started),)
    return tuple(Part(node, PartRef(attempt.job_id, attempt.n, rank, *(runners[rank] if rank < len(runners) else (None, None))))
                 for rank, node in enumerate(nodes))


class Fleet:
    """The daemon's nodes behind one door (see the module docstring); also its ``GpuBackend``."""

    emulated_state_dir: Path | None = None  # each node gives its own to its jobs
    needs_mps_server = False  # each node starts its own

    def __init__(self, nodes: Nodes, head_root: Path, *, grace_s: float = 60.0) -> None:
        self.nodes, self.head_root, self.grace_s = nodes, head_root, grace_s
        self.name = nodes.kind  # what the GPUs are, for ``collocate serve``'s start-up line
        self._check: dict[str, list[PartRef]] = {}  # the parts to poll with the next tick, by node
        self._status: dict[tuple[str, tuple[str, int]], PartStatus] = {}  # this round's answers
        self.known: dict[str, list[DeviceInfo]] = {}  # devices of every node seen
        self._producers: dict[str, NodeProducers] = {}
        #: Membership as people see it (``collocate gpus``): (time, node, what happened).
        self.events: list[tuple[float, str, str]] = []
        self._generation = -1
        self._away: set[str] = set()
        #: Each running attempt's parts, by the identity of its record: a round asks about
        #: each attempt four times, and hashing a whole ``Attempt`` to find them cost more
        #: than making them. Kept for the attempts ``collect`` was last given.
        self._parts: dict[int, tuple[Attempt, tuple[Part, ...]]] = {}
        #: The freezer state each part on a silent node is to be told (``suspend``), by node and part.
        self._owed: dict[tuple[str, tuple[str, int]], tuple[Part, bool]] = {}
        self.learn_devices()

    def parts(self, attempt: Attempt) -> tuple[Part, ...]:
        """``parts_of(attempt)``, made once per attempt record."""
        kept = self._parts.get(id(attempt))
        if kept is not None and kept[0] is attempt:
            return kept[1]
        parts = parts_of(attempt)
        self._parts[id(attempt)] = (attempt, parts)
        return parts

    # -- the GPUs ----------------------------------------------------------------------------
    def learn_devices(self) -> None:
        """After a node was seated (it joined, or came back, maybe with other GPUs): its GPUs.
        A GPU once known stays known (a node that left shows its GPUs away)."""
        if self.nodes.generation == self._generation:
            return
        self._generation = self.nodes.generation
        first = not self.known
        for name in self.nodes.names():
            try:
                devices = self.nodes.node(name).devices()
            except NodeUnreachable:
                continue
            old = self.known.get(name, [])
            added = [d for d in devices if d.uuid not in {o.uuid for o in old}]
            if added:
                self.known[name] = old + added
                if not first:
                    self._event(name, f"joined with {len(added)} GPU(s)" if not old
                                else f"shows {len(added)} more GPU(s)")

    def _event(self, name: str, what: str) -> None:
        log.warning("node %s %s", name, what)
        self.events = [*self.events[-99:], (time.time(), name, what)]

    def devices(self) -> list[DeviceInfo]:
        return [d for name in self.known for d in self.known[name]]

    def sample(self) -> list[DeviceSample]:
        """One tick on every node: its readings, and its parts' status for ``poll``. A node that
        does not answer reports its GPUs as full and unreachable (never free)."""
        try:
            self.nodes.refresh()
        except Exception as exc:  # noqa: BLE001 - e.g. Ray's GCS is down: try again next round
            log.warning("cannot look for joining or returning nodes: %s", exc)
        self.learn_devices()
        asked, self._check = self._check, {}
        answers = self.nodes.tick(asked)
        away = set(self.known) - set(answers)
        for name in sorted(away - self._away):
            self._event(name, "stopped answering")
        for name in sorted(self._away - away):
            self._event(name, "answers again")
        self._away = away
        self._status = {(name, key): status for name, tick in answers.items()
                        for key, status in tick.status.items()}
        if self._owed:
            self._tell_owed(answers)
        now = time.time()
        samples: list[DeviceSample] = []
        for name, devices in self.known.items():
            if name in answers:
                samples.extend(answers[name].samples)
            else:
                samples.extend(DeviceSample(d.uuid, now, d.total_mib, 0.0, reachable=False) for d in devices)
        return samples

    # -- attempts ----------------------------------------------------------------------------
    def start(self, attempt: Attempt, plans: Sequence[LaunchPlan]) -> Attempt:
        """Start every part (``plans`` in rank order); the attempt with its runners. A part that
        cannot start stops those started: all or none."""
        started: list[Part] = []
        try:
            for part, plan in zip(self.parts(attempt), plans, strict=True):
                node = self.nodes.node(part.node)
                started.append(Part(part.node, node.start(plan, part.ref, str(self.head_root))))
        except Exception:
            for part in started:
                self._quietly(part, "signal", signal.SIGKILL)
            raise
        for part in started:
            self._check.setdefault(part.node, []).append(part.ref)
        first = started[0].ref
        runners = tuple((p.ref.pid, p.ref.started) for p in started) if len(started) > 1 else ()
        return replace(attempt, pid=first.pid, pid_started=first.started, runners=runners)

    def poll(self, attempt: Attempt) -> tuple[bool, int | None]:
        """``(alive, runner exit status)`` by the gang rules (module docstring)."""
        silent: set[str] = set()
        statuses = [(part, self._part_status(part, silent)) for part in self.parts(attempt)]
        if len(statuses) == 1:
            part, status = statuses[0]
            if status.alive:
                self._check.setdefault(part.node, []).append(part.ref)
            return status.alive, status.runner_status
        alive = [status.alive for _, status in statuses]
        if all(alive):
            for part, _ in statuses:
                self._check.setdefault(part.node, []).append(part.ref)
            return True, None
        if any(p.node in silent and s.alive for p, s in statuses):
            self._keep_checking(statuses)
            return True, None  # a silent node: wait for its grace period (its runner fences)
        ended_ok = all(s.alive or self._ended_ok(p) for p, s in statuses)
        if ended_ok and any(alive):
            self._keep_checking(statuses)
            return True, None
        return False, next(s.runner_status for _, s in statuses if not s.alive)

    def _keep_checking(self, statuses: list[tuple[Part, PartStatus]]) -> None:
        for part, status in statuses:
            if status.alive:
                self._check.setdefault(part.node, []).append(part.ref)

    def _ended_ok(self, part: Part) -> bool:
        end = self._ended(part)
        return end.record is not None and end.record.lost is None and end.record.returncode == 0

    def _part_status(self, part: Part, silent: set[str]) -> PartStatus:
        """From this round's tick when it asked, else asked now; a silent node's part is alive
        (its node added to ``silent``) until the grace period and the fence margin are over."""
        status = self._status.get((part.node, part.ref.key))
        if status is not None:
            return status
        try:
            return self.nodes.node(part.node).status([part.ref])[part.ref.key]
        except NodeUnreachable:
            silent.add(part.node)
            return PartStatus(self.nodes.down_for(part.node, time.time()) < self.grace_s + FENCE_MARGIN_S)

    def matches(self, attempt: Attempt) -> bool:
        """At a head restart: whether every part's runner still runs (a part on a node that does
        not answer is taken as running, and followed through the grace period)."""
        for part in self.parts(attempt):
            try:
                if not self.nodes.node(part.node).status([part.ref])[part.ref.key].alive:
                    return False
            except NodeUnreachable:
                continue
        return True

    def started(self, attempt: Attempt) -> Attempt:
        """An attempt whose pids were not yet stored, with those its runners recorded."""
        refs = []
        for part in self.parts(attempt):
            try:
                ref = self.nodes.node(part.node).started(part.ref)
            except NodeUnreachable:
                ref = None
            refs.append(ref or part.ref)
        runners = tuple((r.pid, r.started) for r in refs) if len(refs) > 1 else ()
        return replace(attempt, pid=refs[0].pid, pid_started=refs[0].started, runners=runners)

    def ended(self, attempt: Attempt) -> PartEnd:
        """How an attempt whose ``poll`` said it is over ended: the end of the part that decided
        it (lost, else the first that failed, else rank 0's), after stopping the parts that
        still run (a gang never runs on without one of its parts)."""
        parts = self.parts(attempt)
        ends = [(part, self._ended(part)) for part in parts]
        if len(parts) > 1:
            for part, end in ends:
                if end.record is None:
                    self._quietly(part, "signal", signal.SIGKILL)
        for decides in (lambda e: e.record is not None and e.record.lost,  # a node was lost
                        lambda e: e.record is not None and e.record.returncode != 0,  # a part failed
                        lambda e: e.adopted or e.record is None):  # rank 0 alone, or killed
            for _, end in ends:
                if decides(end):
                    return end
        return ends[0][1]

    def _ended(self, part: Part) -> PartEnd:
        try:
            return self.nodes.node(part.node).ended(part.ref)
        except NodeUnreachable:
            if self.nodes.down_for(part.node, time.time()) > 0:
                return PartEnd(ExitRecord(None, time.time(), lost=(
                    f"its node {part.node} stopped answering for over {self.grace_s:g} s; requeued")))
            return PartEnd(None)

    def signal(self, attempt: Attempt, sig: int) -> None:
        """Signal every part's job (a silent node's is stopped by its runner's fence)."""
        for part in self.parts(attempt):
            self._quietly(part, "signal", sig)

    def release(self, attempt: Attempt) -> None:
        for part in self.parts(attempt):
            self._owed.pop((part.node, part.ref.key), None)
            self._quietly(part, "release")

    def suspend(self, attempt: Attempt, frozen: bool) -> list[str]:
        """Freeze (or thaw) every part's job; how each node did it (a silent node: nothing
        now; it is told when it answers again)."""
        done = []
        for part in self.parts(attempt):
            key = (part.node, part.ref.key)
            try:
                done.append(self.nodes.node(part.node).suspend(part.ref, frozen))
                self._owed.pop(key, None)
            except NodeUnreachable:
                self._owed[key] = (part, frozen)
        return done

    def _tell_owed(self, answered: Mapping[str, NodeTick]) -> None:
        """Tell the nodes that answer this round the freezes and thaws they missed."""
        for key, (part, frozen) in list(self._owed.items()):
            if part.node not in answered:
                continue
            try:
                how = self.nodes.node(part.node).suspend(part.ref, frozen)
            except NodeUnreachable:
                continue
            del self._owed[key]
            log.info("job %s: %s on node %s, which answers again, by %s", part.ref.job_id,
                     "frozen" if frozen else "thawed", part.node, how)

    def _quietly(self, part: Part, method: str, *args: int) -> None:
        try:
            node = self.nodes.node(part.node)
            if method == "signal":
                node.signal(part.ref, args[0])
            else:
                node.release(part.ref)
        except NodeUnreachable:
            pass  # a node that comes back stops what the head no longer owns

    def read_log(self, attempt: Attempt, stream: str, offset: int, limit: int, rank: int = 0) -> bytes:
        parts = self.parts(attempt)
        if not 0 <= rank < len(parts):
            return b""
        try:
            return self.nodes.node(parts[rank].node).read_log(parts[rank].ref, stream, offset, limit)
        except NodeUnreachable:
            return b""

    def drop_logs(self, attempt: Attempt) -> int:
        """Remove an ended attempt's logs on every node it ran on (``collocate purge``); the
        bytes freed. A node that does not answer keeps its part's (asked again next purge)."""
        freed = 0
        for part in self.parts(attempt):
            try:
                freed += self.nodes.node(part.node).drop_logs(part.ref)
            except NodeUnreachable:
                pass
        return freed

    def stderr_tail(self, attempt: Attempt) -> str:
        return self.ended(attempt).stderr_tail

    def read_trees(self, roots: Mapping[str, Attempt], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        """Every launched job's process tree, read once per round on its nodes (a job on
        several nodes: its parts' trees summed)."""
        per_node: dict[str, dict[str, int]] = {}
        for job_id, attempt in roots.items():
            for part in self.parts(attempt):
                per_node.setdefault(part.node, {})[job_id] = part.ref.pid or 0
        trees: dict[str, TreeUsage] = {}
        for answer in self.nodes.read_trees(per_node, now, frozenset(gpu_pids)).values():
            for job_id, tree in answer.items():
                trees[job_id] = tree if job_id not in trees else _summed(trees[job_id], tree)
        return trees

    def read_metrics(self, attempts: Mapping[str, Attempt]) -> tuple[list[MetricPoint], list[MetricPoint]]:
        """The launched jobs' new ``log_metric`` points, read on their nodes: all of them (the
        dashboard's), and those of each job's first part (its pace: the ranks of a job across
        nodes step together, and their reports interleaved would read as pauses)."""
        per_node: dict[str, dict[str, PartRef]] = {name: {} for name in self.nodes.names()}
        first: dict[str, str] = {}
        for job_id, attempt in attempts.items():
            parts = self.parts(attempt)
            for part in parts:
                per_node.setdefault(part.node, {})[job_id] = part.ref
            if parts:
                first[job_id] = parts[0].node
        answers = self.nodes.read_metrics(per_node)
        points = [p for points in answers.values() for p in points]
        if len(answers) <= 1:
            return points, points
        return points, [p for name, pts in answers.items() for p in pts if first.get(p.job_id) == name]

    def collect(self, running: Sequence[Attempt]) -> None:
        """Once per round, after the attempts were polled: each node reaps what its jobs left
        behind, and a node seen anew stops the runners the head does not own."""
        owned: dict[str, list[PartRef]] = {name: [] for name in self.nodes.names()}
        kept: dict[int, tuple[Attempt, tuple[Part, ...]]] = {}
        for attempt in running:
            parts = kept[id(attempt)] = (attempt, self.parts(attempt))
            for part in parts[1]:
                owned.setdefault(part.node, []).append(part.ref)
        self._parts = kept
        for name, refs in owned.items():
            try:
                stopped = self.nodes.node(name).collect(refs)
            except NodeUnreachable:
                continue
            for rel in stopped:
                log.warning("node %s: stopped %s, which the head no longer owns", name, rel)

    def producers(self, node: str) -> NodeProducers:
        """The dataset producers of ``node`` (one object per node, kept)."""
        if node not in self._producers:
            self._producers[node] = NodeProducers(self.nodes, node)
        return self._producers[node]

    def all_producers(self) -> list[NodeProducers]:
        return [self.producers(name) for name in self.nodes.names()]

    def confinement_words(self) -> str:
        return self.nodes.confinement_words()

    def close(self) -> None:
        self.nodes.close()


def _summed(a: TreeUsage, b: TreeUsage) -> TreeUsage:
    def add(x: int | None, y: int | None) -> int | None:
        return None if x is None or y is None else x + y

    return TreeUsage(a.pids | b.pids, a.cpu_s + b.cpu_s, a.cpu_percent + b.cpu_percent, a.rss_mib + b.rss_mib,
                     add(a.read_bytes, b.read_bytes), add(a.write_bytes, b.write_bytes))


class NodeProducers:
    """One node's dataset producers as the loop uses them (``ensure``, ``job_env``,
    ``reconcile``, ``adopt``), each call forwarded to the node, so a job's producer runs on its
    node. ``producers`` is what the node last reported (name → pid)."""

    def __init__(self, nodes: Nodes, node: str) -> None:
        self.nodes, self.node = nodes, node
        self.producers: dict[str, int] = {}
        self._env: dict[str, dict[str, str]] = {}

    def _remember(self, running: dict[str, int]) -> None:
        self.producers = running

    def ensure(self, request: ProducerRequest) -> bool:
        answer = self.nodes.node(self.node).ensure_producer(request)  # NodeUnreachable: lost
        self._remember(answer.running)
        if answer.error is not None:
            raise ProducerStartError(answer.error)
        self._env[request.dataset] = answer.job_env
        return answer.ready

    def job_env(self, name: str) -> dict[str, str]:
        return self._env[name]  # asked right after ``ensure`` said ready

    def reconcile(self, wanted: AbstractSet[str]) -> None:
        try:
            answer = self.nodes.node(self.node).reconcile_producers(frozenset(wanted), frozenset(self.producers))
        except NodeUnreachable:
            return  # asked again next round
        self._remember(answer.running)

    def adopt(self, names: AbstractSet[str]) -> None:
        try:
            answer = self.nodes.node(self.node).adopt_producers(frozenset(names))
        except NodeUnreachable:
            return  # its producers are started again when its next job launches
        self._remember(answer.running)
