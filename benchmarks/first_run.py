"""A first run on emulated GPUs: light short jobs with no history, all submitted at once (issue 16).

The trace is drawn (seeded) from the six workloads the H100 bench measured alone
(``benchmarks/results/bench-h100-80gb-hbm3-2026-11-22/summary.csv``: solo SM and DRAM activity,
NVML peak memory), none of them known to the daemon: each job declares what an estimator would
have said (its peak times a factor drawn from 0.88-1.05, the range ``collocate estimate`` showed on
unseen models), except one job that declares nothing and one that declares half its peak. Each
runs ``--seconds`` alone. Every policy gets a fresh daemon with an empty history on one emulated
H100-80GB, under time-slicing and MPS, with default parameters; the same trace also goes through
the simulator (``--profiles unknown``: what a fresh daemon knows) for comparison.

Emulated jobs are real processes that hold emulated memory and slow down by the interference
model; they do not model CUDA start-up or warm-up, so the first-run rules that wait for readings
(``activity.INFER_AFTER_S``) cost them more than they would cost real jobs whose warm-up overlaps.

Run: ``python benchmarks/first_run.py [--seconds 12] [--jobs 14] [--seed 0]``; results go to
``benchmarks/results/first_run-emulated-<date>.{json,md}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from collocate.daemon.child import DaemonProcess
from collocate.gputypes import parse_cluster
from collocate.model import JobProfile, SharingMode
from collocate.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

ROOT = Path(__file__).resolve().parent
BENCH = ROOT / "results" / "bench-h100-80gb-hbm3-2026-11-22" / "summary.csv"
POLICIES = ("exclusive", "carma-ff", "carma-magm", "auto")
MODES = ("time-slicing", "mps")
GPUS = "emulated:1xH100-80GB"


def make_trace(n: int, seconds: float, seed: int) -> list[dict]:
    rows = [r for r in csv.DictReader(BENCH.open()) if r["kind"] == "alone"]
    rng = random.Random(seed)
    jobs = []
    for k in range(n):
        r = rng.choice(rows)
        peak = float(r["gpu_used_mib_max"])
        declared: float | None = peak * rng.uniform(0.88, 1.05)
        if k == n - 2:
            declared = None  # submitted without --mem
        elif k == n - 1:
            declared = peak * 0.5  # under-declared
        jobs.append({"name": f"{r['workload']}-{k:02d}", "peak_mib": round(peak),
                     "declared_mib": None if declared is None else round(declared),
                     "sm": round(float(r["gpu_sm_activity"]), 3),
                     "dram": round(float(r["gpu_dram_activity"]), 3), "seconds": seconds})
    return jobs


def argv(job: dict) -> list[str]:
    return [sys.executable, "-m", "collocate.cli", "emulate-job", "--mem", f"{job['peak_mib']}MiB",
            "--seconds", str(job["seconds"]), "--sm", str(job["sm"]), "--dram", str(job["dram"])]


def run_daemon(policy: str, sharing: str, jobs: list[dict], root: Path) -> dict:
    state = root / f"{policy}-{sharing}"
    state.mkdir(parents=True)
    daemon = DaemonProcess(state, ["--gpus", GPUS, "--policy", policy, "--sharing", sharing],
                           root / f"{policy}-{sharing}.log", name=f"the {policy} daemon")
    try:
        daemon.wait_ready()
        for job in jobs:
            mem = None if job["declared_mib"] is None else f"{job['declared_mib']}MiB"
            daemon.client.request("submit", argv=argv(job), mem=mem, name=job["name"], cwd=str(root),
                                  base_env=dict(os.environ))
        most = 0
        while True:
            rows = daemon.client.request("ls", all=True)
            most = max(most, sum(r["state"] == "running" for r in rows))
            if all(r["state"] in ("done", "failed", "cancelled", "rejected") for r in rows):
                break
            time.sleep(0.5)
    finally:
        daemon.stop(timeout_s=10)
    ends = [r["end_time"] for r in rows if r["end_time"]]
    return {"makespan_s": round(max(ends) - min(r["submit_time"] for r in rows), 1),
            "mean_jct_s": round(sum(r["end_time"] - r["submit_time"] for r in rows) / len(rows), 1),
            "most_at_once": most, "done": sum(r["state"] == "done" for r in rows),
            "oom_crashes": sum(r["oom_crashes"] for r in rows),
            "failed": sum(r["state"] == "failed" for r in rows)}


def simulate(policy: str, sharing: str, jobs: list[dict]) -> dict:
    trace = []
    for job in jobs:
        estimates = {} if job["declared_mib"] is None else {"declared": float(job["declared_mib"])}
        w = Workload(job["name"], 1, job["seconds"], float(job["peak_mib"]), estimates,
                     JobProfile(job["sm"], job["dram"]))
        trace.append(TraceJob(job["name"], 0.0, w))
    config = SimConfig(sharing=SharingMode(sharing), estimator="declared", profiles="unknown",
                       ramp_s=2.0)
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy(policy), config).run()
    jct = [r.end - r.submit for r in result.records if r.end is not None]
    return {"makespan_s": round(result.makespan_s, 1), "mean_jct_s": round(sum(jct) / len(jct), 1),
            "waits": result.waits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    jobs = make_trace(args.jobs, args.seconds, args.seed)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for sharing in MODES:
            for policy in POLICIES:
                measured = run_daemon(policy, sharing, jobs, Path(tmp))
                predicted = simulate(policy, sharing, jobs)
                results.append({"policy": policy, "sharing": sharing, "daemon": measured,
                                "simulator": predicted})
                print(policy, sharing, measured, predicted, flush=True)
    exclusive = {r["sharing"]: r["daemon"]["makespan_s"] for r in results if r["policy"] == "exclusive"}
    out = ROOT / "results" / f"first_run-emulated-{date.today().isoformat()}"
    out.with_suffix(".json").write_text(json.dumps(
        {"machine": "2-core CPU dev machine, no GPU; emulated 1xH100-80GB", "seed": args.seed,
         "seconds": args.seconds, "jobs": jobs, "results": results}, indent=1) + "\n")
    lines = ["# First run on an emulated H100: light short jobs without history", "",
             f"{args.jobs} jobs of {args.seconds:g} s alone drawn (seed {args.seed}) from the H100 bench's "
             "six measured workloads; one without `--mem`, one under-declared at half its peak. "
             "`benchmarks/first_run.py`, 2-core CPU dev machine (no GPU).", "",
             "| sharing | policy | makespan (s) | vs exclusive | mean JCT (s) | most at once | OOM crashes | done "
             "| simulator makespan (s) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        d, s = r["daemon"], r["simulator"]
        lines.append(f"| {r['sharing']} | {r['policy']} | {d['makespan_s']:.1f} "
                     f"| {d['makespan_s'] / exclusive[r['sharing']]:.2f}x | {d['mean_jct_s']:.1f} "
                     f"| {d['most_at_once']} | {d['oom_crashes']} | {d['done']}/{len(jobs)} "
                     f"| {s['makespan_s']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
