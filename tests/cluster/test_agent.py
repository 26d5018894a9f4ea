"""``NodeAgent`` (a ``LocalNode`` that starts runners double-forked) in-process, without Ray:
real runners on emulated GPUs, through the ``Node`` API."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from collocate.cluster.agent import NodeAgent
from collocate.core.model import GpuId, Job, Placement, SharingMode
from collocate.daemon.plan import plan_launch
from collocate.daemon.producers import producer_request
from collocate.gpus.mps import MpsDirs
from collocate.node.api import PartRef
from collocate.node.isolate import bootstrap_argv
from collocate.node.launcher import ENV_EMULATED_DIR, localize
from collocate.wire.spec import JobSpec


def _plan(head: Path, argv: tuple[str, ...], job_id: str = "1", cwd: str = "/"):
    job = Job(job_id, mem_mib=1000)
    placement = Placement(job_id, (GpuId("a", 0),), 1000.0)
    return plan_launch(job, JobSpec(argv, cwd), placement, ("GPU-emu-a-0",), attempt=1,
                       attempt_dir=head / "jobs" / job_id / "attempt-1",
                       sharing=SharingMode.MPS, emulated_dir=head / "emulated",
                       mps_dirs=MpsDirs.under(head))


def _wait(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_localize_moves_the_heads_paths_to_the_node(tmp_path: Path):
    head = tmp_path / "head"
    plan = _plan(head, ("python", "train.py", str(head / "not-moved-job-args")), cwd="/work")
    local = localize(plan, str(head), "/node/root", Path("/node/root/emulated"))
    assert local.dir == Path("/node/root/jobs/1/attempt-1")
    assert local.argv[:6] == tuple(bootstrap_argv("collocate.node.runner"))
    assert "--dir" in local.argv and "/node/root/jobs/1/attempt-1" in local.argv
    assert local.env[ENV_EMULATED_DIR] == "/node/root/emulated"
    assert local.env["CUDA_MPS_PIPE_DIRECTORY"] == "/node/root/mps/pipe"
    assert local.env["COLLOCATE_METRICS_FILE"] == "/node/root/jobs/1/attempt-1/metrics.jsonl"
    assert local.cwd == "/work"
    no_emulation = localize(plan, str(head), "/node/root", None)
    assert ENV_EMULATED_DIR not in no_emulation.env


def test_localize_keeps_a_path_the_node_gave_under_the_heads_root(tmp_path: Path):
    """A node's root lies under the head's state dir (``nodes/NAME``) when they share a disk:
    the share dir a node's producer serves from (``COLLOCATE_SHARE_DIR``) is the node's already."""
    head = tmp_path / "head"
    node = head / "nodes" / "a"
    plan = _plan(head, ("python", "train.py"))
    plan = replace(plan, env={**plan.env, "COLLOCATE_SHARE_DIR": str(node / "share")})
    local = localize(plan, str(head), str(node), None)
    assert local.env["COLLOCATE_SHARE_DIR"] == str(node / "share")
    assert local.dir == node / "jobs" / "1" / "attempt-1"


def test_read_metrics_returns_each_jobs_new_points_since_the_last_call(tmp_path: Path):
    agent = NodeAgent(node="a", root=str(tmp_path / "node"), gpus="emulated:1xA100-40GB")
    try:
        adir = tmp_path / "node" / "jobs" / "7" / "attempt-1"
        adir.mkdir(parents=True)
        metrics = adir / "metrics.jsonl"
        rel = {"7": PartRef("7", 1)}
        assert agent.read_metrics(rel) == []  # not written yet
        metrics.write_text('{"t": 1.0, "key": "loss", "value": 0.5, "step": 0}\n{"t": 2.0, "ke')
        assert [(p.job_id, p.key, p.value, p.step) for p in agent.read_metrics(rel)] == [("7", "loss", 0.5, 0)]
        with metrics.open("a") as f:
            f.write('y": "loss", "value": 0.25, "step": 1}\n')
        assert [(p.key, p.value) for p in agent.read_metrics(rel)] == [("loss", 0.25)]
        assert agent.read_metrics(rel) == []
        with pytest.raises(ValueError, match="outside"):
            agent.read_metrics({"8": PartRef("../../elsewhere", 1)})
    finally:
        agent.close()


def test_a_new_agent_adopts_and_stops_a_producer_an_earlier_one_started(tmp_path: Path):
    """The node was away and got a new agent; the head still knows the producer runs there."""
    daemon_tests = Path(__file__).parent.parent / "daemon"
    spec = producer_request(JobSpec((sys.executable, "job.py"), str(daemon_tests), env=dict(os.environ),
                                    dataset="tiny", dataset_factory="_dataset_factory:tiny"))
    first = NodeAgent(node="a", root=str(tmp_path / "node"), gpus="emulated:1xA100-40GB")
    answer = first.ensure_producer(spec)
    assert answer.error is None and answer.job_env["COLLOCATE_SHARE_DIR"] == str(tmp_path / "node" / "share")
    pid = answer.running["tiny"]
    _wait(lambda: first.ensure_producer(spec).ready, timeout=60)
    first.close()  # a daemon's (and an agent's) producers outlive it
    second = NodeAgent(node="a", root=str(tmp_path / "node"), gpus="emulated:1xA100-40GB")
    try:
        assert second.reconcile_producers(set(), set()).running == {}  # knows nothing of it by itself
        assert second.reconcile_producers(set(), {"tiny"}).running == {"tiny": pid}  # adopted, SIGTERM sent
        _wait(lambda: second.reconcile_producers(set(), set()).running == {}, timeout=30)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        second.close()
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_runner_is_double_forked_and_followed_by_its_records(tmp_path: Path):
    agent = NodeAgent(node="a", root=str(tmp_path / "node"), gpus="emulated:2xA100-40GB")
    try:
        assert [str(d.id) for d in agent.devices()] == ["a:0", "a:1"]
        assert len(agent.tick([]).samples) == 2
        plan = _plan(tmp_path / "head", (sys.executable, "-c", "print('hello'); import time; time.sleep(1)"))
        part = agent.start(plan, PartRef("1", 1), str(tmp_path / "head"))
        pid, started = part.runner
        assert psutil.Process(pid).ppid() != os.getpid()  # nobody's child here: outlives the agent
        assert os.getpgid(pid) == pid  # its own process group, signalled as one
        rel = "jobs/1/attempt-1"
        other = PartRef("2", 1, pid=pid, started=started + 5.0)
        tick = agent.tick([part, other])
        assert len(tick.samples) == 2 and tick.status[part.key].alive and not tick.status[other.key].alive
        assert _wait(agent.live_runners) == {rel: (pid, started)}
        assert agent.started(PartRef("1", 1)) == part
        assert _wait(lambda: not agent.status([part])[part.key].alive)
        end = agent.ended(part)
        assert end.record is not None and end.record.returncode == 0
        assert agent.read_log(part, "stdout", 0, 100) == b"hello\n"
        assert agent.read_log(part, "stdout", 2, 2) == b"ll"
        assert agent.live_runners() == {}
        with pytest.raises(ValueError):
            agent.read_log(PartRef("../../../etc", 1), "stdout", 0, 10)
    finally:
        agent.close()


def test_stop_unowned_kills_only_runners_the_head_does_not_own(tmp_path: Path):
    agent = NodeAgent(node="a", root=str(tmp_path / "node"), gpus="emulated:1xA100-40GB")
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    head = str(tmp_path / "head")
    mine = agent.start(_plan(tmp_path / "head", sleeper, "1"), PartRef("1", 1), head)
    stray = agent.start(_plan(tmp_path / "head", sleeper, "2"), PartRef("2", 1), head)
    try:
        _wait(lambda: len(agent.live_runners()) == 2)
        assert agent.collect([mine]) == ["jobs/2/attempt-1"]  # a new agent's first collect
        _wait(lambda: not agent.status([stray])[stray.key].alive)  # runner and job: the whole group
        assert agent.status([mine])[mine.key].alive
        assert list(agent.live_runners()) == ["jobs/1/attempt-1"]
        assert agent.collect([]) == []  # once: the next rounds stop nothing
        trees = agent.read_trees({"1": mine.pid or 0}, time.time(), frozenset())
        assert mine.pid in trees["1"].pids
    finally:
        for part in (mine, stray):
            agent.signal(part, signal.SIGKILL)
        agent.close()
