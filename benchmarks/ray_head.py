"""The Ray head against single-node mode: 1,000 queued short jobs on 24 emulated GPUs.

    python benchmarks/ray_head.py [--jobs 1000] [--idle-seconds 30]

Two runs of a real ``collocate serve`` (policy ``exclusive``, 0.2 s period): single-node on
``emulated:24xA100-40GB``, and ``--ray`` on a local Ray cluster (``ray.cluster_utils.Cluster``)
of 3 collocate nodes x ``emulated:8xA100-40GB`` plus a Ray head node without GPUs. In each, the
jobs (a shell line that appends its id and the wall-clock time to a file, 100 MiB declared)
are submitted while the daemon is drained, then it resumes and runs them all. Measured, from
the daemon's SQLite store once it is stopped and the jobs' file:

* launch latency: from the round that placed an attempt (its recorded start) to the moment the
  job's own command ran: the placement-to-job path (runner start-up included; through Ray, an
  agent and the double fork in ``--ray``);
* jobs launched per second: attempts over the span from the first launch to the last;
* head CPU while idle (user+sys of the ``collocate serve`` process, all jobs done, over
  ``--idle-seconds``), and, for ``--ray``, of the agents' Ray worker processes too.

Writes benchmarks/results/ray_head-<date>.json and .md (``_machine.machine()`` says where).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine
from daemon_load import wait_until_serving

from collocate.client.connect import Client, list_jobs

NODES = ("n1", "n2", "n3")


def start_daemon(state: Path, args: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(state),
                             "--policy", "exclusive", "--period", "0.2", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return wait_until_serving(proc, state, timeout_s=180)


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run(state: Path, args: list[str], jobs: int, idle_s: float,
        agents: Callable[[], list[psutil.Process]] = list) -> dict:
    proc = start_daemon(state, args)
    try:
        client = Client(state)
        client.request("drain")
        env = dict(os.environ)
        starts = state.parent / f"{state.name}-starts.txt"
        line = f'echo "$COLLOCATE_JOB_ID $(date +%s.%N)" >> {starts}'
        for i in range(jobs):
            client.request("submit", argv=["sh", "-c", line], cwd=str(state.parent), mem="100MiB",
                           name=f"j{i}", base_env=env)
        t0 = time.time()
        client.request("resume")
        while True:
            rows = list_jobs(client.request, all=True)
            if all(r["state"] in ("done", "failed", "cancelled") for r in rows):
                break
            if time.time() - t0 > 1800:
                raise SystemExit("jobs did not finish in 30 min")
            time.sleep(1.0)
        wall = time.time() - t0
        states = [r["state"] for r in rows]
        time.sleep(3.0)
        head = psutil.Process(proc.pid)
        others = agents()
        c0, a0, m0 = cpu_s([head]), cpu_s(others), time.monotonic()
        time.sleep(idle_s)
        c1, a1, m1 = cpu_s([head]), cpu_s(others), time.monotonic()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    db = sqlite3.connect(state / "collocate.common.sqlite")
    attempts = db.execute("SELECT job_id, start FROM attempts").fetchall()
    db.close()
    ran = {job: float(at) for job, at in (text.split() for text in starts.read_text().splitlines())}
    latency = sorted(ran[job] - start for job, start in attempts if job in ran)
    launches = sorted(start for _, start in attempts)
    return {
        "jobs": jobs, "done": states.count("done"), "attempts": len(attempts),
        "wall_s_resume_to_all_done": wall,
        "launch_latency_ms_median": 1000 * statistics.median(latency),
        "launch_latency_ms_p95": 1000 * latency[int(0.95 * (len(latency) - 1))],
        "launched_per_s": len(launches) / max(launches[-1] - launches[0], 1e-9),
        "idle_window_s": m1 - m0,
        "head_idle_cpu_percent_of_one_core": 100 * (c1 - c0) / (m1 - m0),
        "agents_idle_cpu_percent_of_one_core": 100 * (a1 - a0) / (m1 - m0) if others else None,
    }


def agent_processes() -> list[psutil.Process]:
    """The Ray workers running collocate agents (their process title names the actor)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if "NodeAgent" in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it "
                    "(the daemons' logs and stores), instead of a temporary one")
    ap.add_argument("--only", choices=("single", "ray"), default=None, help="run one mode only")
    ns = ap.parse_args()
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    result: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="collocate-ray-bench-") as tmp:
        root = Path(tmp) if ns.keep is None else ns.keep
        if ns.only != "ray":
            result["single_node"] = run(root / "single", ["--gpus", "emulated:24xA100-40GB"],
                                        ns.jobs, ns.idle_seconds)
        if ns.only == "single":
            print(json.dumps(result, indent=2))
            return
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=0, num_gpus=0, object_store_memory=80 * 2**20, include_dashboard=False))
        try:
            for name in NODES:
                cluster.add_node(num_cpus=1, num_gpus=0, object_store_memory=80 * 2**20,
                                 resources={"collocate": 1}, labels={"collocate-node": name})
            result["ray_3x8"] = run(root / "ray", ["--ray", cluster.address, "--gpus", "emulated:8xA100-40GB"],
                                    ns.jobs, ns.idle_seconds, agents=agent_processes)
        finally:
            cluster.shutdown()
        if ns.only == "ray":
            print(json.dumps(result, indent=2))
            return
    out = Path(__file__).parent / "results" / f"ray_head-{result['machine']['date']}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    m, s, r = result["machine"], result["single_node"], result["ray_3x8"]

    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def row(name: str, key: str, fmt: str) -> str:
        return f"| {name} | {cell(s[key], fmt)} | {cell(r[key], fmt)} |\n"

    md = (f"# Ray head vs single-node ({m['date']}, {m['host_cpu']}, {m['cores']} cores, "
          f"Python {m['python']}, no GPU)\n\n"
          f"{ns.jobs} queued jobs (`sh -c 'echo ... >> file'`, policy exclusive, 0.2 s period) on 24 emulated A100s: one "
          "node, or a local Ray cluster of 3 nodes x 8 (all on this one machine).\n\n"
          "| metric | single-node | Ray head, 3 x 8 |\n| --- | --- | --- |\n"
          + row("jobs done", "done", "d") + row("attempts", "attempts", "d")
          + row("resume to all done (s)", "wall_s_resume_to_all_done", ".1f")
          + row("launch latency median (ms)", "launch_latency_ms_median", ".1f")
          + row("launch latency p95 (ms)", "launch_latency_ms_p95", ".1f")
          + row("jobs launched per second", "launched_per_s", ".1f")
          + row("head idle CPU (% of one core)", "head_idle_cpu_percent_of_one_core", ".2f")
          + row("agents idle CPU (% of one core, 3 agents)", "agents_idle_cpu_percent_of_one_core", ".2f")
          + "\nLaunch latency: from the round that placed the attempt to the job's command running "
            "(runner start-up included). The machine was shared with other work.\n")
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
