"""The head's scheduling round at scale: 10, 50 and 100 nodes x 8 GPUs, 10,000 queued jobs.

    python benchmarks/head_scale.py [--nodes 10 50 100] [--jobs 10000] [--rounds 20]

The head is the real daemon (``daemon.service.Service``: SQLite store, world model, policy
``auto``, usage monitor; no dashboard) opened in-process on ``InProcessNodes`` of ``FakeNode``s
(``collocate/node/fake.py``): the ``Node`` API with H100-80GB GPUs and no processes, so what is
measured is the head alone. Jobs are submitted through the API as a member would (validated and
stored), 20 GiB declared each, while the daemon drains; then it resumes and the rounds run
back to back (``SchedulingRound.run``, what ``serve_forever`` calls every ``--period``):

* fill: the first rounds, which place jobs until every GPU holds what its memory allows (a job
  placed is started on its fake node);
* steady: rounds on the full cluster with the rest of the queue waiting (nothing fits);
* churn: each round 1 % of the running jobs end on their nodes and the round reaps them and
  places as many new ones.

Reported per scale: round time (median, p95, max) in each phase, placement latency (a churn
round's time over the jobs it placed, and the fill's time per job placed), how long the
tracking sinks' writers (the monitoring store and Prometheus, threads of their own) then took to
write the round's tick (untimed in
the round: each round waits for it, as the daemon's period leaves it the time), the process's CPU
time in the median round (what the wall time is on a machine nobody else uses), and memory (the
process's RSS after opening and after the queue is in, from ``psutil``). Writes
benchmarks/results/head_scale-<date>.json and .md (``_machine.machine()`` says where).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

from collocate.daemon.config import ServeConfig
from collocate.daemon.fleet import InProcessNodes
from collocate.daemon.server import Peer
from collocate.daemon.service import Service
from collocate.daemon.tracking import TrackingConfig
from collocate.node.fake import FakeNode


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(times_s: list[float], cpu_s: list[float]) -> dict:
    """Wall time of the rounds, and the process's CPU time in them: on a shared machine the
    wall time also counts the time others held the cores, the CPU time does not."""
    ms = [t * 1000 for t in times_s]
    return {"rounds": len(ms), "median_ms": statistics.median(ms) if ms else None,
            "p95_ms": pct(ms, 0.95), "max_ms": max(ms) if ms else None,
            "cpu_median_ms": statistics.median(cpu_s) * 1000 if cpu_s else None}


def run_scale(n_nodes: int, n_jobs: int, rounds: int, workdir: Path) -> dict:
    nodes = [FakeNode(f"n{i:03d}", gpus=8) for i in range(n_nodes)]
    state = workdir / f"head-{n_nodes}"
    service = Service(ServeConfig(state, policy="auto", period_s=1.0, tracking=TrackingConfig()),
                      nodes=InProcessNodes(nodes))
    base = rss_mib()
    service.open()
    opened = rss_mib()
    me = Peer(os.getuid(), os.getgid())
    service.api.answer("drain", {}, me)
    started = time.perf_counter()
    for i in range(n_jobs):
        service.api.answer("submit", {"argv": ["python", "train.py", f"--seed={i}"], "cwd": str(workdir),
                                      "mem": "20GiB", "key": f"key-{i:08d}"}, me)
    submit_s = time.perf_counter() - started
    queued = rss_mib()
    service.api.answer("resume", {}, me)

    cpu: dict[str, list[float]] = {"fill": [], "steady": [], "churn": []}
    written: list[float] = []  # how long the store's writer took after each round

    def store_pending() -> int:
        """Calls the tracking sinks' writers (threads of their own: the store, Prometheus) have
        yet to deliver."""
        return sum(s["pending"] for s in service.tracking.mon.status()["tracking"])

    def timed_round(phase: str) -> tuple[float, int]:
        """One round; then, untimed, wait for the tracking sinks' writers (threads of their
        own, which the daemon leaves the rest of its period) to write what the round made."""
        before = len(service.attempts.running)
        t0, c0 = time.perf_counter(), time.process_time()
        service.round.run()
        cpu[phase].append(time.process_time() - c0)
        t1 = time.perf_counter()
        while store_pending():
            time.sleep(0.0005)
        written.append(time.perf_counter() - t1)
        return t1 - t0, len(service.attempts.running) - before

    fill, placed_fill = [], 0
    while True:  # fill: until a round places nothing
        dt, placed = timed_round("fill")
        fill.append(dt)
        placed_fill += max(0, placed)
        if placed <= 0 or len(fill) > 500:
            break
    steady = [timed_round("steady")[0] for _ in range(rounds)]
    churn, per_job = [], []
    for _ in range(rounds):
        running = list(service.attempts.running.values())
        for run in running[: max(1, len(running) // 100)]:
            node = next(n for n in nodes if n.name == run.attempt.nodes[0])
            node.finish(run.attempt.job_id, run.attempt.n)
        before = sum(1 for j in service.scheduler.jobs.values() if j.state.value == "done")
        dt, _ = timed_round("churn")
        ended = sum(1 for j in service.scheduler.jobs.values() if j.state.value == "done") - before
        churn.append(dt)
        if ended:
            per_job.append(dt / ended)
    result = {
        "nodes": n_nodes, "gpus": 8 * n_nodes, "jobs_queued": n_jobs,
        "running_after_fill": placed_fill, "submit_s": round(submit_s, 1),
        "fill": {**summary(fill, cpu["fill"]), "placed": placed_fill,
                 "ms_per_placement": 1000 * sum(fill) / placed_fill if placed_fill else None},
        "steady": summary(steady, cpu["steady"]),
        "churn": {**summary(churn, cpu["churn"]), "placement_latency_ms_median": 1000 * statistics.median(per_job) if per_job else None},
        "store_write_ms_median": 1000 * statistics.median(written[-2 * rounds:]),
        "rss_mib": {"before_open": round(base, 1), "opened": round(opened, 1),
                    "with_queue": round(queued, 1), "after_rounds": round(rss_mib(), 1)},
    }
    service.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--date", default=None, help="the date the results are filed under")
    ns = parser.parse_args()
    where = machine()
    where["device"] = "none (CPU)"
    if ns.date:
        where["date"] = ns.date
    results = []
    with tempfile.TemporaryDirectory(prefix="head-scale-") as tmp:
        for n in ns.nodes:
            results.append(run_scale(n, ns.jobs, ns.rounds, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    out = Path(__file__).parent / "results" / f"head_scale-{where['date']}"
    out.with_suffix(".json").write_text(json.dumps({"machine": where, "results": results}, indent=2) + "\n")
    lines = [f"# Head round at scale ({where['date']})", "",
             f"Machine: {where['host_cpu']}, {where['cores']} cores, Python {where['python']}; "
             f"device: {where['device']}. Policy auto, 20 GiB jobs on H100-80GB fake nodes "
             "(`benchmarks/head_scale.py`).", "",
             "| nodes x GPUs | queued | running | round, full cluster (median / p95; CPU) "
             "| round, 1 % churn (median / p95; CPU) | placement latency (churn, per job) "
             "| fill: rounds, ms per job placed | store write after a round | RSS: opened / with queue / after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(
            f"| {r['nodes']} x 8 | {r['jobs_queued']:,} | {r['running_after_fill']:,} "
            f"| {r['steady']['median_ms']:.0f} / {r['steady']['p95_ms']:.0f} ms; {r['steady']['cpu_median_ms']:.0f} ms "
            f"| {r['churn']['median_ms']:.0f} / {r['churn']['p95_ms']:.0f} ms; {r['churn']['cpu_median_ms']:.0f} ms "
            f"| {r['churn']['placement_latency_ms_median'] or float('nan'):.1f} ms "
            f"| {r['fill']['rounds']}, {r['fill']['ms_per_placement'] or float('nan'):.1f} ms | {r['store_write_ms_median']:.0f} ms "
            f"| {r['rss_mib']['opened']:.0f} / {r['rss_mib']['with_queue']:.0f} / {r['rss_mib']['after_rounds']:.0f} MiB |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
