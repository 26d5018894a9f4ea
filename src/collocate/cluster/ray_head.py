"""The daemon as the head of a Ray cluster: one ``NodeAgent`` actor per node, as ``Nodes``.

The only module that imports Ray (lazily, from ``collocate serve --ray``). The daemon (queue,
core, policies, SQLite, API, dashboard, and the ``Fleet`` that follows every attempt's parts) is
the one of a single server; this module gives it the cluster's nodes as ``RayNodes``:

* each node's agent is a ``NodeAgent`` actor (a ``LocalNode``) and ``RayNode`` its proxy, the
  ``Node`` API over Ray calls with a timeout: a call that fails or times out marks the node down
  and raises ``NodeUnreachable`` (the ``Fleet`` keeps a silent node's parts unconfirmed for the
  grace period, then records them lost);
* a round's calls to every node (``tick``: GPU readings and runner status; process trees;
  metrics) go out at once and wait 1 s in all: a node that does not answer in time is down;
* membership is elastic: every ``REFRESH_S`` the head looks for nodes that joined the cluster
  with the ``collocate`` resource, or came back, and seats an agent on each without waiting for
  it (its GPUs are used once it answered); a node that left is down, and after the grace period
  its attempts are lost and requeued. A node that comes back gets a new agent, which stops every
  runner there the head no longer owns, so nothing runs twice after a partition.

Agents are asked for no GPUs and no CPUs (``num_gpus=0, num_cpus=0``): collocate keeps its own GPU
accounting and sets ``CUDA_VISIBLE_DEVICES`` itself. Nodes are those whose raylet carries the
``collocate`` resource; a node's name is its ``collocate-node`` label (``ray start --labels
collocate-node=NAME``), else its hostname.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from collocate.cluster.agent import NodeAgent
from collocate.cluster.exposure import check_session_dir, require_token
from collocate.common.errors import CollocateError
from collocate.gpus.base import DeviceInfo
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.process_tree import TreeUsage
from collocate.node.api import Node, NodeTick, NodeUnreachable, PartEnd, PartRef, PartStatus, Producers
from collocate.node.confine import NodeBounds
from collocate.node.datasets import ProducerRequest
from collocate.node.launcher import LaunchPlan

log = logging.getLogger("collocate.cluster")
RESOURCE = "collocate"  # the custom resource that marks a node as collocate's
NAME_LABEL = "collocate-node"  # the label that names a node (else its hostname)
CALL_TIMEOUT_S = 10.0  # one call to one agent
SAMPLE_TIMEOUT_S = 1.0  # the round's parallel calls: the loop answers requests between rounds
BEAT_S = 0.5  # how often the head reaches every answering agent (``Agents._beat``)
REFRESH_S = 5.0  # how often the head looks for nodes that (re)joined
AGENT_START_S = 120.0  # how long a new agent may take to answer


class NodeDown(NodeUnreachable):
    """The node's agent did not answer (dead, partitioned or not started)."""


P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Call(Generic[R]):
    """One ``Node`` method call to send to an agent, whose answer is an ``R`` (build it with
    ``call``)."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def call(method: Callable[Concatenate[Node, P], R], *args: P.args, **kwargs: P.kwargs) -> Call[R]:
    """``method`` of the ``Node`` protocol (``Node.tick``) with its arguments. Why not the
    method's name: through the protocol, mypy checks the arguments against its signature and
    gives the answer its type, where a name and ``getattr`` on the actor (untyped: a Ray actor
    handle) would check nothing. The agent, a ``LocalNode``, runs its method of that name."""
    return Call(method.__name__, args, kwargs)


@dataclass
class Seat:
    """One node's agent as the head knows it."""

    name: str
    node_id: str
    actor: Any
    address: str = "127.0.0.1"
    down_since: float | None = None
    reconcile: bool = True  # stop the runners the head does not own at the next ``collect``
    agent_died: bool = False  # its actor is gone: a new agent is due once the raylet lives


class Agents:
    """The agent actors by node name: starts them, calls them, notices nodes join, leave and
    return (``RayNodes`` is what the daemon sees of them)."""

    kind = "ray"
    generation = 0  # counts seatings (``Fleet`` then asks the new agents for their GPUs)

    def __init__(self, *, gpus: str, sharing: str, state_dir: Path, bounds: NodeBounds | None = None,
                 fence_after_s: float | None = None, session_dir: str | None = None) -> None:
        self.gpus, self.sharing, self.state_dir = gpus, sharing, state_dir
        self.bounds, self.fence_after_s = bounds or NodeBounds(), fence_after_s  # each agent's
        self.session_dir = session_dir
        self.confinement: dict[str, str] = {}  # node → how its jobs are confined
        self.seats: dict[str, Seat] = {}
        self.known: dict[str, list[DeviceInfo]] = {}  # devices of every node seen since start
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

    def nodes(self) -> dict[str, tuple[str, str]]:
        """Alive nodes carrying the ``collocate`` resource: name → (Ray node id, address)."""
        found: dict[str, tuple[str, str]] = {}
        for n in ray.nodes():
            if not n.get("Alive") or n.get("Resources", {}).get(RESOURCE, 0) <= 0:
                continue
            name = (n.get("Labels") or {}).get(NAME_LABEL) or n.get("NodeManagerHostname", "")
            if not name or any(c in name for c in ":/ ") or name in found:
                raise CollocateError(
                    f"two collocate nodes are named {name!r}, or the name has ':', '/' or ' '",
                    hint=f"start each node with `ray start ... --labels {NAME_LABEL}=NAME` "
                         "and a unique NAME")
            found[name] = (n["NodeID"], n.get("NodeManagerAddress") or "127.0.0.1")
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
        for name, (node_id, address) in self.nodes().items():
            seat = self.seats.get(name)
            if name in self._starting or (seat is not None and seat.node_id == node_id
                                          and not seat.agent_died):
                continue  # seated, being started, or silent on a live raylet (``_recheck_silent``)
            self._start(name, node_id, address)
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

    def _start(self, name: str, node_id: str, address: str) -> None:
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
                 sharing=self.sharing, bounds=self.bounds, fence_after_s=self.fence_after_s,
                 session_dir=self.session_dir, address=address)
        self._starting[name] = (node_id, actor, actor.hello.remote(), time.monotonic())

    def _seat_started(self, *, wait: bool) -> None:
        """Seat the agents started earlier that have answered (all of them, with ``wait``)."""
        for name, (node_id, actor, hello, since) in list(self._starting.items()):
            left = AGENT_START_S - (time.monotonic() - since)
            if not ray.wait([hello], timeout=max(0.0, left) if wait else 0)[0] and left > 0:
                continue
            del self._starting[name]
            try:
                devices, self.confinement[name], address = ray.get(hello, timeout=0)
            except (RayError, GetTimeoutError) as exc:
                log.error("node %s: its collocate agent did not start: %s", name, exc)
                ray.kill(actor)
                continue
            self._seat(name, node_id, actor, devices, address)

    def _seat(self, name: str, node_id: str, actor: Any, devices: list[DeviceInfo], address: str) -> None:
        self._pinging.pop(name, None)
        old = self.seats.get(name)
        if old is not None:
            ray.kill(old.actor)
            log.warning("node %s is back: new agent; runners the head no longer owns will be stopped", name)
        if self._started and name not in self.known:
            log.warning("node %s joined with %d GPU(s); they take jobs from the next rounds", name, len(devices))
        known = self.known.setdefault(name, devices)
        if [d.uuid for d in known] != [d.uuid for d in devices]:
            log.warning("node %s came back with other GPUs (%d, was %d)", name, len(devices), len(known))
            self.known[name] = devices
        self.seats[name] = Seat(name, node_id, actor, address)
        self.generation += 1

    def call(self, name: str, request: Call[R], timeout: float = CALL_TIMEOUT_S) -> R:
        seat = self.seats.get(name)
        if seat is None or seat.down_since is not None:
            raise NodeDown(name)
        try:
            answer: R = ray.get(_send(seat.actor, request), timeout=timeout)
            return answer
        except RayTaskError as exc:  # the agent answered, with an error of its own (a full disk...)
            raise exc.as_instanceof_cause() from None
        except RayError as exc:
            self.mark_down(name, exc)
            raise NodeDown(name) from exc

    def call_all(self, requests: Mapping[str, Call[R]], timeout: float = SAMPLE_TIMEOUT_S) -> dict[str, R]:
        """One call on each answering agent named in ``requests``, all at once; the answers of
        those that answered in time."""
        refs = {name: _send(seat.actor, requests[name]) for name, seat in self.seats.items()
                if seat.down_since is None and name in requests}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout) if refs else ([], [])
        answers: dict[str, R] = {}
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

    # -- the daemon's ``Nodes`` --------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self.seats)

    def node(self, name: str) -> RayNode:
        seat = self.seats.get(name)
        if seat is None or seat.down_since is not None:
            raise NodeDown(name)
        return RayNode(self, name, seat.address)

    def tick(self, parts: Mapping[str, Sequence[PartRef]]) -> dict[str, NodeTick]:
        return self.call_all({name: call(Node.tick, list(parts.get(name, ()))) for name in self.seats})

    def read_trees(self, roots: Mapping[str, Mapping[str, int]], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, dict[str, TreeUsage]]:
        return self.call_all({n: call(Node.read_trees, dict(r), now, frozenset(gpu_pids)) for n, r in roots.items()})

    def read_metrics(self, parts: Mapping[str, Mapping[str, PartRef]]) -> dict[str, list[MetricPoint]]:
        """Each node reads its jobs' metrics files; a node whose jobs all ended is asked with
        none, so it closes their files."""
        return self.call_all({n: call(Node.read_metrics, dict(p)) for n, p in parts.items()})

    def confinement_words(self) -> str:
        return "; ".join(f"{name}: {words}" for name, words in sorted(self.confinement.items()))


class RayNode:
    """One node's agent as a ``Node``: each call forwarded to its actor, with a timeout; a node
    that does not answer raises ``NodeUnreachable`` (``NodeDown``) and is marked down."""

    def __init__(self, agents: Agents, name: str, address: str) -> None:
        self.agents, self.name, self._address = agents, name, address

    def _call(self, request: Call[R], timeout: float = CALL_TIMEOUT_S) -> R:
        return self.agents.call(self.name, request, timeout)

    def devices(self) -> list[DeviceInfo]:
        return list(self.agents.known.get(self.name, []))

    def address(self) -> str:
        return self._address

    def free_port(self) -> int:
        return self._call(call(Node.free_port))

    def tick(self, parts: Sequence[PartRef]) -> NodeTick:
        return self._call(call(Node.tick, list(parts)), SAMPLE_TIMEOUT_S)

    def status(self, parts: Sequence[PartRef]) -> dict[tuple[str, int], PartStatus]:
        return self._call(call(Node.status, list(parts)))

    def start(self, plan: LaunchPlan, part: PartRef, head_root: str) -> PartRef:
        return self._call(call(Node.start, plan, part, head_root), 60)

    def started(self, part: PartRef) -> PartRef | None:
        return self._call(call(Node.started, part))

    def ended(self, part: PartRef) -> PartEnd:
        return self._call(call(Node.ended, part))

    def signal(self, part: PartRef, sig: int) -> None:
        self._call(call(Node.signal, part, sig))

    def suspend(self, part: PartRef, frozen: bool) -> str:
        return self._call(call(Node.suspend, part, frozen))

    def release(self, part: PartRef) -> None:
        self._call(call(Node.release, part))

    def read_log(self, part: PartRef, stream: str, offset: int, limit: int) -> bytes:
        return self._call(call(Node.read_log, part, stream, offset, limit))

    def drop_logs(self, part: PartRef) -> int:
        return self._call(call(Node.drop_logs, part))

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        return self._call(call(Node.read_trees, dict(roots), now, frozenset(gpu_pids)))

    def read_metrics(self, parts: Mapping[str, PartRef]) -> list[MetricPoint]:
        return self._call(call(Node.read_metrics, dict(parts)))

    def collect(self, owned: Collection[PartRef]) -> list[str]:
        return self._call(call(Node.collect, list(owned)))

    def ensure_producer(self, request: ProducerRequest) -> Producers:
        return self._call(call(Node.ensure_producer, request), 60)

    def reconcile_producers(self, wanted: AbstractSet[str], known: AbstractSet[str]) -> Producers:
        return self._call(call(Node.reconcile_producers, frozenset(wanted), frozenset(known)))

    def adopt_producers(self, names: AbstractSet[str]) -> Producers:
        return self._call(call(Node.adopt_producers, frozenset(names)))

    def confinement_words(self) -> str:
        return self.agents.confinement.get(self.name, "")

    def close(self) -> None:
        pass  # the agents close with ``Agents.close``


def _send(actor: Any, request: Call[Any]) -> Any:
    """Send ``request`` to an agent's actor handle (untyped: Ray's handles are dynamic); its
    object ref."""
    return getattr(actor, request.method).remote(*request.args, **request.kwargs)


def open_ray_nodes(config: Any, bounds: NodeBounds) -> Agents:
    """Connect to the Ray cluster at ``config.ray`` (``auto``: the local one) and seat an agent on
    every collocate node (those that join later are seated as they come)."""
    try:
        ray.init(address=config.ray, namespace="collocate", logging_level=logging.WARNING,
                 log_to_driver=False)
    except (ConnectionError, RayError, ValueError) as exc:
        raise CollocateError(f"cannot connect to the Ray cluster at {config.ray!r}: {exc}",
                             hint="start it first (`ray start --head ...`, see docs/multi-node.md), "
                                  "or pass its address, e.g. --ray 10.0.0.1:6379") from exc
    try:  # before any agent runs: a cluster open to all, or with an open session folder, is refused
        require_token(ray.get_runtime_context().gcs_address)
        node: Any = ray._private.worker._global_node
        session = Path(node.get_session_dir_path())
        check_session_dir(session)
    except CollocateError:
        ray.shutdown()
        raise
    agents = Agents(gpus=config.gpus, sharing=config.sharing.value, state_dir=config.state_dir,
                    bounds=bounds, fence_after_s=config.node_grace_s, session_dir=str(session))
    if not agents.seats:
        raise CollocateError(f"no node of the Ray cluster carries the {RESOURCE!r} resource",
                             hint=f"start each GPU node with `ray start --resources '{{\"{RESOURCE}\": 1}}' "
                                  f"--labels {NAME_LABEL}=NAME ...` (docs/multi-node.md)")
    log.info("Ray cluster: %d node(s): %s", len(agents.seats), ", ".join(sorted(agents.seats)))
    return agents

