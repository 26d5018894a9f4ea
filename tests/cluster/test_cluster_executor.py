"""``ClusterExecutor``'s rules without a cluster: routing by node, the grace period of a node
that stops answering, and what a returning node is told to stop."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray_head imports Ray: pip install 'collocate[ray]'")

from collocate.cluster.ray_head import ClusterExecutor, NodeDown, Seat  # noqa: E402
from collocate.daemon.executor import MachineUnreachable  # noqa: E402
from collocate.daemon.store import Attempt  # noqa: E402

HEAD = Path("/state")


class FakeAgents:
    """Agents whose nodes answer from a table, or not at all (``down``: since when)."""

    def __init__(self) -> None:
        self.seats = {n: Seat(n, f"id-{n}", None) for n in ("a", "b")}
        self.down: dict[str, float] = {}
        self.calls: list[tuple] = []
        self.now = 1000.0
        self.checked: dict[str, tuple[set, set]] = {}
        self.to_check: dict[str, set] = {}

    def check_next_tick(self, name, runner):
        self.to_check.setdefault(name, set()).add(runner)

    def call(self, name, method, *args, timeout=0.0):
        self.calls.append((name, method, *args))
        if name in self.down:
            raise NodeDown(name)
        return {"poll": True, "start": (42, 1.5), "stop_unowned": ["jobs/9/attempt-1"],
                "exit_record": None}.get(method)

    def down_for(self, name, now):
        return self.now - self.down[name] if name in self.down else 0.0


def _attempt(job: str, node: str) -> Attempt:
    return Attempt(job, 1, 0.0, (f"{node}:0",), (f"GPU-{node}",), str(HEAD / "jobs" / job / "attempt-1"),
                   pid=42, pid_started=1.5)


def test_calls_go_to_the_attempts_node_with_its_relative_folder():
    agents = FakeAgents()
    executor = ClusterExecutor(agents, HEAD, grace_s=60)  # type: ignore[arg-type]
    assert executor.start("plan", _attempt("1", "b")) == (None, 42, 1.5)  # type: ignore[arg-type]
    assert agents.calls[-1] == ("b", "start", "plan", "/state", "1", 1)
    executor.exit_record(_attempt("1", "b"))
    assert agents.calls[-1] == ("b", "exit_record", "jobs/1/attempt-1")


def test_a_round_polls_runners_from_its_samples_answer():
    agents = FakeAgents()
    executor = ClusterExecutor(agents, HEAD, grace_s=60)  # type: ignore[arg-type]
    started = executor.start("plan", _attempt("1", "a"))  # type: ignore[arg-type]
    assert agents.to_check == {"a": {(42, 1.5)}}  # checked with the next samples
    agents.checked = {"a": ({(42, 1.5)}, set())}  # asked, and no longer running
    calls = len(agents.calls)
    assert executor.poll(started[0], _attempt("1", "a")) == (False, None)
    assert len(agents.calls) == calls  # no call of its own


def test_a_silent_node_is_unconfirmed_for_the_grace_period_then_lost(monkeypatch):
    agents = FakeAgents()
    executor = ClusterExecutor(agents, HEAD, grace_s=60)  # type: ignore[arg-type]
    monkeypatch.setattr("collocate.cluster.ray_head.time.time", lambda: agents.now)
    attempt = _attempt("1", "a")
    agents.down["a"] = agents.now - 59
    assert executor.poll(None, attempt) == (True, None)  # unconfirmed: still counted as running
    assert executor.matches(attempt)  # a restarted head re-adopts it, and waits too
    agents.down["a"] = agents.now - 61
    assert executor.poll(None, attempt) == (True, None)  # the runner has 2 s to stop the job
    agents.down["a"] = agents.now - 62.5
    assert executor.poll(None, attempt) == (False, None)
    record = executor.exit_record(attempt)
    assert record is not None and "node a stopped answering" in record["lost"]
    with pytest.raises(MachineUnreachable):
        executor.start("plan", attempt)  # type: ignore[arg-type]
    assert executor.read_log(attempt, "stdout", 0, 10) == b""


def test_a_new_agent_stops_what_the_head_no_longer_owns():
    agents = FakeAgents()
    executor = ClusterExecutor(agents, HEAD, grace_s=60)  # type: ignore[arg-type]
    executor.poll(None, _attempt("1", "a"))
    executor.poll(None, _attempt("2", "b"))
    executor.collect(set())
    stops = [c for c in agents.calls if c[1] == "stop_unowned"]
    assert stops == [("a", "stop_unowned", {"jobs/1/attempt-1"}), ("b", "stop_unowned", {"jobs/2/attempt-1"})]
    executor.collect(set())  # once per agent: the next rounds ask nothing
    assert len([c for c in agents.calls if c[1] == "stop_unowned"]) == 2
