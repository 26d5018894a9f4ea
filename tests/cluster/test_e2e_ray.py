"""``collocate serve --ray`` end to end on a local 3-node Ray cluster with emulated GPUs.

The head is a real ``collocate serve`` subprocess; jobs are real processes started by the agents
(double-forked); node failures are SIGKILLs of a node's Ray processes (``conftest.LocalCluster``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import job_argv, wait_for

from collocate.common.errors import CollocateError
from collocate.monitor.store import MonitorStore, monitor_db_path
from collocate.share.lifecycle import probe

DAEMON_TESTS = Path(__file__).parent.parent / "daemon"  # dataset_job.py, _dataset_factory.py


def _marker_job(marker: Path, seconds: float) -> list[str]:
    """Sleeps, then appends its attempt number to ``marker``: one line per run that finished."""
    code = ("import os, sys, time; time.sleep(float(sys.argv[2])); "
            "open(sys.argv[1], 'a').write(os.environ['COLLOCATE_ATTEMPT'] + '\\n')")
    return [sys.executable, "-c", code, str(marker), str(seconds)]


def _gated_marker_job(marker: Path, gate: Path) -> list[str]:
    """Waits until ``gate`` exists, then appends its attempt number to ``marker``: a job that is
    certainly still running until the test says otherwise, however loaded the machine."""
    code = ("import os, sys, time, pathlib\n"
            "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.2)\n"
            "open(sys.argv[1], 'a').write(os.environ['COLLOCATE_ATTEMPT'] + '\\n')")
    return [sys.executable, "-c", code, str(marker), str(gate)]


def _node_of(detail: dict, n: int = -1) -> str:
    return detail["attempts"][n]["gpus"][0].split(":")[0]


def test_a_mixed_trace_runs_over_the_nodes_and_a_gang_stays_on_one(heads, tmp_path: Path):
    head = heads("--policy", "exclusive")
    gpus = head.client.request("gpus")
    assert sorted(g["id"] for g in gpus) == [f"n{i}:{j}" for i in (1, 2, 3) for j in (0, 1)]
    jobs = [head.submit(job_argv(mem, 2.0), mem=mem) for mem in (4000, 8000, 2000, 6000, 3000)]
    pair = head.submit(job_argv(5000, 2.0), mem=5000, gpus=2)
    printer = head.submit([sys.executable, "-c", "import os; print('from a node at nice', os.nice(0))"],
                          mem=100)
    with pytest.raises(CollocateError, match="can never run here"):
        head.submit(job_argv(1000, 1.0), mem=1000, gpus=3)  # no node has 3 GPUs
    for job_id in [*jobs, pair, printer]:
        detail = head.wait_state(job_id, ("done", "failed"), timeout=90)
        assert detail["state"] == "done", detail
    nodes = {_node_of(head.job(j)) for j in jobs}
    assert len(nodes) >= 2, f"six single-GPU jobs on six GPUs all ran on {nodes}"
    gang = head.job(pair)["attempts"][0]["gpus"]
    assert len(gang) == 2 and len({g.split(":")[0] for g in gang}) == 1, gang
    logs = head.client.request("logs", id=printer)
    assert logs["text"] == f"from a node at nice {os.nice(0)}\n"  # not Ray's workers' niceness
    node = _node_of(head.job(printer))
    assert (head.state_dir / "nodes" / node / "jobs" / printer / "attempt-1" / "stdout.log").exists()


def test_a_node_lost_for_good_has_its_job_fenced_then_run_elsewhere_once(heads, ray_cluster,
                                                                         tmp_path: Path):
    """Issue 31, row 10: the raylet of the job's node is killed and not restarted while the test
    checks. Its GPUs show as away; once its agent has been gone for the grace period the runner
    there stops the job (fencing), and only then is the job run on another node, without using up
    an attempt: its work is done exactly once."""
    head = heads("--policy", "exclusive", grace=4.0)
    marker = tmp_path / "marker"
    job = head.submit(_marker_job(marker, 15.0), mem=1000)
    first = wait_for(lambda: (d := head.job(job))["attempts"] and d["attempts"][0]["pid"] and d, 60,
                     "a runner")
    lost = _node_of(first)
    ray_cluster.kill(lost)
    try:
        away = wait_for(lambda: [g for g in head.client.request("gpus") if not g["reachable"]], 30,
                        "the node's GPUs to show as away")
        assert {g["node"] for g in away} == {lost}
        again = wait_for(lambda: len((d := head.job(job))["attempts"]) == 2 and d, 90, "a second attempt")
        assert again["attempts"][0]["outcome"] == "lost" and lost in again["attempts"][0]["reason"]
        assert again["state"] == "running" and _node_of(again) != lost  # requeued, not failed
        fenced = json.loads((head.state_dir / "nodes" / lost / "jobs" / job / "attempt-1" / "exit.json")
                            .read_text())  # written on the lost node by its runner
        assert "stopped on its node" in fenced["lost"], fenced
        assert fenced["end"] <= again["attempts"][1]["start"], (fenced, again["attempts"][1])
        done = head.wait_state(job, ("done", "failed"), timeout=120)
        assert done["state"] == "done", done
        assert marker.read_text().splitlines() == [str(done["attempts"][-1]["n"])]  # exactly once
    finally:
        ray_cluster.start(lost)  # for the tests after this one, once this one has checked


def test_a_node_back_within_the_grace_period_keeps_its_job(heads, ray_cluster, tmp_path: Path):
    head = heads("--policy", "exclusive", grace=120.0)
    marker, gate = tmp_path / "marker", tmp_path / "gate"
    job = head.submit(_gated_marker_job(marker, gate), mem=1000)
    first = wait_for(lambda: (d := head.job(job))["attempts"] and d["attempts"][0]["pid"] and d,
                     60, "a runner")
    node = _node_of(first)
    ray_cluster.kill(node)
    try:
        wait_for(lambda: [g for g in head.client.request("gpus") if not g["reachable"]], 30,
                 "the node's GPUs to show as away")
        assert head.job(job)["state"] == "running"  # unconfirmed, not lost
    finally:
        ray_cluster.start(node)  # a new agent, which finds the runner it still owns
    wait_for(lambda: f"node {node} is back" in (head.state_dir / "daemon.log").read_text(), 60,
             "a new agent on the node")
    assert head.job(job)["state"] == "running"  # the new agent did not stop a runner the head owns
    gate.touch()
    done = head.wait_state(job, ("done", "failed"), timeout=90)
    assert [a["outcome"] for a in done["attempts"]] == ["succeeded"], done["attempts"]
    assert marker.read_text() == "1\n"


def test_a_killed_head_restarts_and_readopts_running_jobs(heads, tmp_path: Path):
    head = heads("--policy", "exclusive")
    markers = [tmp_path / f"m{i}" for i in range(2)]
    jobs = [head.submit(_marker_job(m, 6.0), mem=1000) for m in markers]
    for job in jobs:
        head.wait_state(job, "running", timeout=60)
    head.kill(signal.SIGKILL)
    time.sleep(1.0)
    head.start()
    for job, marker in zip(jobs, markers, strict=True):
        detail = head.wait_state(job, ("done", "failed"), timeout=90)
        assert detail["state"] == "done", detail
        assert [a["outcome"] for a in detail["attempts"]] == ["succeeded"]  # re-adopted, not rerun
        assert marker.read_text() == "1\n"


def test_a_datasets_producer_runs_on_each_node_of_its_jobs_and_stops_after(heads):
    """Two jobs of one dataset, each needing a whole node (2 GPUs): one producer on each node,
    started by that node's agent (its share dir under the node's root), none on the head."""
    head = heads("--policy", "exclusive")
    job_argv_ = [sys.executable, str(DAEMON_TESTS / "dataset_job.py"), "20", "3"]
    jobs = [head.submit(job_argv_, mem="1GiB", gpus=2, cwd=str(DAEMON_TESTS), dataset="tiny",
                        dataset_factory="_dataset_factory:tiny") for _ in range(2)]
    for job in jobs:
        detail = head.wait_state(job, ("done", "failed"), timeout=120)
        assert detail["state"] == "done", (detail, head.client.request("logs", id=job, offset=0))
        assert "consumed 20 samples" in head.client.request("logs", id=job, offset=0)["text"]
    nodes = {_node_of(head.job(j)) for j in jobs}
    assert len(nodes) == 2, nodes
    for node in nodes:
        share = head.state_dir / "nodes" / node / "share"
        assert (share / "tiny.log").exists(), sorted(share.iterdir()) if share.exists() else share
        wait_for(lambda share=share: probe("tiny", share) is None and not (share / "tiny.pid").exists(), 30,
                 f"the producer on {node} to stop")
    assert not (head.state_dir / "share" / "tiny.log").exists()  # nothing ran on the head


def test_a_jobs_logged_metrics_are_read_on_its_node_and_stored_by_the_head(heads):
    head = heads("--policy", "exclusive")
    job = head.submit([sys.executable, str(DAEMON_TESTS / "metric_job.py"), "500", "1.0"], mem=1000)
    detail = head.wait_state(job, ("done", "failed"), timeout=90)
    assert detail["state"] == "done", detail
    node = _node_of(detail)
    assert (head.state_dir / "nodes" / node / "jobs" / job / "attempt-1" / "metrics.jsonl").exists()
    assert not (head.state_dir / "jobs" / job / "attempt-1" / "metrics.jsonl").exists()
    store = MonitorStore(monitor_db_path(head.state_dir))
    try:
        logged = [(m["key"], m["step"], m["value"]) for m in store.metrics(job)]
    finally:
        store.close()
    assert logged == [("loss", i, 1.0 / (i + 1)) for i in range(5)]


def test_a_dataset_job_outlives_a_killed_head_and_its_producer_is_readopted(heads):
    head = heads("--policy", "exclusive")
    job = head.submit([sys.executable, str(DAEMON_TESTS / "dataset_job.py"), "20", "8"], mem="1GiB",
                      cwd=str(DAEMON_TESTS), dataset="tiny", dataset_factory="_dataset_factory:tiny")
    head.wait_state(job, "running", timeout=60)
    wait_for(lambda: list(head.state_dir.glob(f"nodes/*/jobs/{job}/attempt-1/runner.json")), 60,
             "the job to launch after its producer")
    head.kill(signal.SIGKILL)
    time.sleep(1.0)
    head.start()
    detail = head.wait_state(job, ("done", "failed"), timeout=90)
    assert detail["state"] == "done", (detail, head.client.request("logs", id=job, offset=0))
    assert [a["outcome"] for a in detail["attempts"]] == ["succeeded"]
    share = head.state_dir / "nodes" / _node_of(detail) / "share"
    wait_for(lambda: probe("tiny", share) is None, 30, "the re-adopted producer to stop")
