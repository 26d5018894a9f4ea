"""The head's ``Fleet`` over fake nodes (``node/fake.py``, the ``Node`` API without processes):
routing by node, the gang rules of a job on several nodes, the grace period of a node that stops
answering, and who is told to stop what. No Ray, no processes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from collocate.daemon.fleet import FENCE_MARGIN_S, Fleet, InProcessNodes, parts_of
from collocate.daemon.store import Attempt
from collocate.monitor.job_metrics import MetricPoint
from collocate.node.api import NodeUnreachable
from collocate.node.fake import FakeNode
from collocate.node.launcher import LaunchPlan

HEAD = Path("/state")


class Clocked(InProcessNodes):
    """In-process nodes where a node marked ``down`` has been silent since a set time."""

    def __init__(self, nodes, now: list[float]) -> None:
        super().__init__(nodes)
        self.now, self.down_since = now, {}

    def node(self, name):
        node = super().node(name)
        if node.down:
            self.down_since.setdefault(name, self.now[0])
            raise NodeUnreachable(name)
        return node

    def down_for(self, name, now):
        return self.now[0] - self.down_since[name] if name in self.down_since else 0.0

    def tick(self, parts):
        answers = {}
        for name, node in self.nodes.items():
            try:
                answers[name] = node.tick(parts.get(name, ()))
            except NodeUnreachable:
                self.down_since.setdefault(name, self.now[0])
        return answers


def _fleet(monkeypatch, names=("a", "b", "c")):
    now = [1000.0]
    monkeypatch.setattr("collocate.daemon.fleet.time.time", lambda: now[0])
    nodes = {n: FakeNode(n, gpus=2, clock=lambda: now[0]) for n in names}
    return Fleet(Clocked(list(nodes.values()), now), HEAD, grace_s=60), nodes, now


def _attempt(job: str, *nodes: str) -> Attempt:
    gpus = tuple(f"{n}:{i}" for n in nodes for i in range(2))
    return Attempt(job, 1, 0.0, gpus, tuple(f"GPU-fake-{g.replace(':', '-')}" for g in gpus),
                   str(HEAD / "jobs" / job / "attempt-1"))


def _plan(rank: int) -> LaunchPlan:
    return LaunchPlan(("runner", str(rank)), {}, "/", HEAD, None, None)


def test_each_part_starts_on_its_node_in_rank_order(monkeypatch):
    fleet, nodes, _ = _fleet(monkeypatch)
    attempt = fleet.start(_attempt("1", "b", "a"), [_plan(0), _plan(1)])
    assert [p.node for p in parts_of(attempt)] == ["b", "a"]
    assert nodes["b"].plans[("1", 1)].argv == ("runner", "0")
    assert nodes["a"].plans[("1", 1)].argv == ("runner", "1")
    assert len(attempt.runners) == 2 and attempt.pid == attempt.runners[0][0]
    assert fleet.poll(attempt) == (True, None)
    assert [d.id.node for d in fleet.devices()] == ["a", "a", "b", "b", "c", "c"]


def test_a_part_that_cannot_start_stops_those_started(monkeypatch):
    fleet, nodes, _ = _fleet(monkeypatch)
    nodes["c"].down = True
    with pytest.raises(NodeUnreachable):
        fleet.start(_attempt("1", "a", "c"), [_plan(0), _plan(1)])
    assert nodes["a"].running() == [] and nodes["a"].signals == [(("1", 1), signal.SIGKILL)]


def test_a_failed_part_ends_the_gang_and_stops_the_others(monkeypatch):
    fleet, nodes, _ = _fleet(monkeypatch)
    attempt = fleet.start(_attempt("1", "a", "b"), [_plan(0), _plan(1)])
    nodes["b"].finish("1", 1, returncode=3)
    fleet.sample()
    assert fleet.poll(attempt) == (False, None)
    end = fleet.ended(attempt)
    assert end.record is not None and end.record.returncode == 3
    assert nodes["a"].running() == []  # rank 0 was stopped with it


def test_a_gang_runs_on_while_its_parts_end_well(monkeypatch):
    fleet, nodes, _ = _fleet(monkeypatch)
    attempt = fleet.start(_attempt("1", "a", "b"), [_plan(0), _plan(1)])
    nodes["a"].finish("1", 1)
    fleet.sample()
    assert fleet.poll(attempt) == (True, None)  # rank 1 still finishing its last step
    nodes["b"].finish("1", 1)
    fleet.sample()
    assert fleet.poll(attempt)[0] is False
    end = fleet.ended(attempt)
    assert end.record is not None and end.record.returncode == 0


def test_a_silent_node_keeps_the_gang_unconfirmed_then_it_is_lost(monkeypatch):
    fleet, nodes, now = _fleet(monkeypatch)
    attempt = fleet.start(_attempt("1", "a", "b"), [_plan(0), _plan(1)])
    nodes["b"].down = True
    fleet.sample()
    nodes["a"].finish("1", 1, returncode=1)  # its peer is gone: the collective fails
    fleet.sample()
    assert fleet.poll(attempt) == (True, None)  # waits for the node's grace period
    now[0] += 60 + FENCE_MARGIN_S - 0.5
    fleet.sample()
    assert fleet.poll(attempt)[0] is True  # b's runner has until then to fence its job
    now[0] += 1.0
    fleet.sample()
    assert fleet.poll(attempt)[0] is False
    end = fleet.ended(attempt)
    assert end.record is not None and end.record.lost and "node b stopped answering" in end.record.lost


def test_a_freeze_or_thaw_a_silent_node_missed_is_carried_out_when_it_answers_again(monkeypatch):
    # issue 35: the head's record of a job as frozen must be true on its node once it is back
    fleet, nodes, _ = _fleet(monkeypatch)
    attempt = fleet.start(_attempt("1", "a"), [_plan(0)])
    nodes["a"].down = True
    assert fleet.suspend(attempt, True) == []  # nothing done yet
    fleet.sample()
    assert nodes["a"].frozen == set()
    nodes["a"].down = False
    fleet.sample()
    assert nodes["a"].frozen == {("1", 1)}
    nodes["a"].down = True  # a thaw missed the same way
    fleet.suspend(attempt, False)
    nodes["a"].down = False
    fleet.sample()
    assert nodes["a"].frozen == set()
    nodes["a"].down = True  # the latest order counts, and a released attempt is owed nothing
    fleet.suspend(attempt, True)
    fleet.suspend(attempt, False)
    fleet.suspend(attempt, True)
    fleet.release(attempt)
    nodes["a"].down = False
    fleet.sample()
    assert nodes["a"].frozen == set()


def test_collect_tells_each_node_which_parts_the_head_owns(monkeypatch):
    fleet, nodes, _ = _fleet(monkeypatch)
    owned = []

    def collect(name):
        def record(refs):
            owned.append((name, sorted(r.job_id for r in refs)))
            return []
        return record

    for name, node in nodes.items():
        monkeypatch.setattr(node, "collect", collect(name))
    first = fleet.start(_attempt("1", "a", "b"), [_plan(0), _plan(1)])
    second = fleet.start(_attempt("2", "c"), [_plan(0)])
    fleet.collect([first, second])
    assert sorted(owned) == [("a", ["1"]), ("b", ["1"]), ("c", ["2"])]


class Reporting(FakeNode):
    """A fake node whose every asked part reports one step, named after the node."""

    def read_metrics(self, parts):
        self._check()
        return [MetricPoint(job_id, 1.0, self.name, 0.5, step=7) for job_id in parts]


def test_a_jobs_pace_comes_from_its_first_part_and_every_parts_points_are_kept():
    nodes = [Reporting(n, gpus=2) for n in ("a", "b", "c")]
    fleet = Fleet(InProcessNodes(nodes), HEAD)
    gang = fleet.start(_attempt("1", "b", "a"), [_plan(0), _plan(1)])
    solo = fleet.start(_attempt("2", "c"), [_plan(0)])
    points, paced = fleet.read_metrics({"1": gang, "2": solo})
    assert sorted((p.job_id, p.key) for p in points) == [("1", "a"), ("1", "b"), ("2", "c")]
    assert sorted((p.job_id, p.key) for p in paced) == [("1", "b"), ("2", "c")]  # rank 0's steps only
