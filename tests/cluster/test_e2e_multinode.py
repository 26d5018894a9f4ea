"""Jobs across nodes and nodes that come and go, end to end on the session's local Ray cluster
(``conftest.LocalCluster``: three collocate nodes of 2 emulated A100s each).

* a 2-node job whose parts run a real ``torch.distributed`` all-reduce over gloo through
  torchrun, with no rendezvous arguments (collocate sets them), and agree on the result;
* a node SIGKILLed during a 2-node job: the whole gang is stopped, the job requeued without using
  up an attempt, and its work done exactly once;
* a node that joins mid-run gets an agent and takes work without a head restart.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from daemon_harness import wait_for

from collocate.node.launcher import process_matches

ALLREDUCE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    out = os.path.join(sys.argv[1], f"rank-{rank}")
    open(out, "w").write(f"{value.item()} {dist.get_world_size()} {os.environ['NODE_RANK']}\\n")
    dist.destroy_process_group()
""")


def _nodes_of(detail: dict) -> list[str]:
    return list(dict.fromkeys(g.split(":")[0] for g in detail["attempts"][-1]["gpus"]))


def test_a_two_node_torchrun_job_all_reduces_over_gloo_with_no_rendezvous_arguments(heads, tmp_path: Path):
    pytest.importorskip("torch", reason="the all-reduce needs torch (the CPU build is enough)")
    head = heads("--policy", "exclusive")
    script, out = tmp_path / "allreduce.py", tmp_path / "out"
    script.write_text(ALLREDUCE)
    out.mkdir()
    job = head.submit([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                       str(script), str(out)], mem=1000, gpus=1, nodes=2)
    running = head.wait_state(job, ("running", "done", "failed"), timeout=60)
    detail = head.wait_state(job, ("done", "failed"), timeout=300)
    logs = {n: head.client.request("logs", id=job, offset=0, node=n, stream="stderr")["text"]
            for n in _nodes_of(detail)}
    assert detail["state"] == "done", (detail, logs)
    assert len(set(_nodes_of(running))) == 2 and detail["nodes"] == 2
    results = sorted(p.read_text().split() for p in out.iterdir())
    assert results == [["3.0", "2", "0"], ["3.0", "2", "1"]]  # 1 + 2 on both ranks, one per node
    shown = head.job(job)
    assert shown["attempts"][0]["nodes"] == _nodes_of(detail)
    assert [len(r) for r in shown["attempts"][0]["runners"]] == [2, 2]  # a runner per part


def _gang_job(marker: Path, seconds: float) -> list[str]:
    """Each part sleeps, then appends ``attempt rank`` to ``marker``: a line per part that
    finished its work."""
    code = ("import os, sys, time; time.sleep(float(sys.argv[2])); "
            "open(sys.argv[1], 'a').write(os.environ['COLLOCATE_ATTEMPT'] + ' ' + os.environ['NODE_RANK'] + '\\n')")
    return [sys.executable, "-c", code, str(marker), str(seconds)]


def test_a_node_killed_during_a_two_node_job_stops_the_gang_and_runs_it_once(heads, ray_cluster,
                                                                           tmp_path: Path):
    head = heads("--policy", "exclusive", grace=4.0)
    marker = tmp_path / "marker"
    job = head.submit(_gang_job(marker, 20.0), mem=1000, gpus=1, nodes=2)
    first = wait_for(lambda: (d := head.job(job))["attempts"] and all(r[0] for r in d["attempts"][0]["runners"])
                     and d, 60, "both parts' runners")
    lost, survivor = _nodes_of(first)[1], _nodes_of(first)[0]
    ray_cluster.kill(lost)
    try:
        again = wait_for(lambda: len((d := head.job(job))["attempts"]) == 2 and d, 90, "a second attempt")
        assert again["attempts"][0]["outcome"] == "lost" and lost in again["attempts"][0]["reason"]
        assert lost not in _nodes_of(again) and again["state"] == "running"  # requeued, not failed
        runner = json.loads((head.state_dir / "nodes" / survivor / "jobs" / job / "attempt-1" / "runner.json")
                            .read_text())
        wait_for(lambda: not process_matches(runner["pid"], runner["started"]), 15,
                 "the part on the surviving node to be stopped with the gang")
        done = head.wait_state(job, ("done", "failed"), timeout=120)
        assert done["state"] == "done", done
        assert done["attempts_used"] == 1 or done["attempts"][0]["outcome"] == "lost"
        assert sorted(marker.read_text().splitlines()) == ["2 0", "2 1"]  # once, by the 2nd attempt
    finally:
        ray_cluster.start(lost)  # for the tests after this one


def test_a_node_that_joins_mid_run_takes_work_without_a_restart(heads, ray_cluster, tmp_path: Path):
    head = heads("--policy", "exclusive")
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    busy = [head.submit(sleeper, mem=1000, gpus=2) for _ in range(3)]
    for job in busy:
        head.wait_state(job, "running", timeout=60)  # every GPU of n1..n3 taken
    late = tmp_path / "late"
    waiting = head.submit([sys.executable, "-c", f"open({str(late)!r}, 'w').write('ran')"], mem=1000)
    assert head.job(waiting)["state"] == "pending"
    ray_cluster.start("n4")
    try:
        detail = head.wait_state(waiting, ("running", "done"), timeout=90)
        assert _nodes_of(detail) == ["n4"]
        gpus = head.client.request("gpus")
        assert {g["id"] for g in gpus if g["node"] == "n4"} == {"n4:0", "n4:1"}
        assert any((g.get("node_event") or [0, ""])[1].startswith("joined") for g in gpus if g["node"] == "n4")
        assert head.wait_state(waiting, "done", timeout=60)["state"] == "done"
    finally:
        for job in busy:
            head.client.request("cancel", id=job)
        ray_cluster.kill("n4")
    assert late.read_text() == "ran"
