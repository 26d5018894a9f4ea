"""A first run and a returning user on emulated GPUs, as issue 29 tried them on an H100.

The trace (``first_run_trace.py``): 14 training jobs through one script, with start-ups, memory
ramps and first steps before steady activity, as real PyTorch jobs show them to a scheduler; one
job without ``--mem``, one declaring half its peak, the rest an estimate's 1.02x of their peak.
All are submitted at once to a fresh daemon on one emulated H100-80GB (default parameters, period
1 s). After the first run, the same user submits 8 of the jobs again with new output paths
(``first_run_trace.RETURNING``) to the same daemon, whose history should find them.

Runs: ``exclusive`` (the baseline; time-slicing, which it never uses), ``carma-magm`` and
``auto`` under time-slicing and under MPS (the default for one user, ``--sharing auto``). Each
run's makespan is measured against exclusive's: the first run's, and for the returning 8 the sum
of their durations in the exclusive run (which runs one job at a time). Besides makespans: jobs at
once, out-of-memory crashes, each job's worst slowdown (its time over its exclusive time), and
job by job against the plain queue: each job's completion time (submission to end) over its
completion time under ``exclusive`` (p50, p95, max, jobs worse off:
``collocate.sim.metrics.versus_exclusive``, the function ``collocate simulate`` reports with).
The same trace goes through the simulator (the same world model, ``collocate.core.world``; the
daemon's period; what a fresh daemon knows), for every policy of the CARMA family too, so the
prediction is checked against the emulated run; and the model floor (``collocate.sim.floor``,
start-up and first steps taken out of the work since they overlap anything) says how far any
policy could go.

Run: ``python benchmarks/first_run.py [--scale 1.0] [--quick]``; results go to
``benchmarks/results/first_run-emulated-<date>.{json,md}``. ``--quick`` (0.25x durations,
``exclusive`` and ``auto`` under MPS only, about 4 minutes) rehearses it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

from collocate.core.gputypes import parse_cluster
from collocate.core.model import JobProfile, SharingMode
from collocate.core.policies import make_policy
from collocate.daemon.child import DaemonProcess
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.floor import floors
from collocate.sim.metrics import versus_exclusive
from collocate.sim.trace import TraceJob as SimJob
from collocate.sim.trace import Workload

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from first_run_trace import RETURNING, TRACE  # noqa: E402

SCRIPT = ROOT / "first_run_trace.py"
GPUS = "emulated:1xH100-80GB"
TERMINAL = ("done", "failed", "cancelled", "rejected")
RUNS = (("exclusive", "time-slicing"), ("carma-magm", "time-slicing"), ("auto", "time-slicing"),
        ("carma-magm", "mps"), ("auto", "mps"))
QUICK_RUNS = (("exclusive", "time-slicing"), ("auto", "mps"))
CARMA = ("carma-ff", "carma-bf", "carma-magm", "carma-lug")


def submit_all(daemon: DaemonProcess, jobs, workdir: Path, batch: str) -> dict[str, str]:
    """Submit ``jobs`` as the user would (``collocate submit``'s request): job name -> id."""
    ids = {}
    for t in jobs:
        declared = t.declared_mib
        reply = daemon.client.request(
            "submit", argv=t.argv(sys.executable, str(SCRIPT), f"runs/{batch}/{t.name}"),
            mem=None if declared is None else f"{declared:.0f}MiB", name=t.name, cwd=str(workdir),
            base_env=dict(os.environ))
        ids[t.name] = reply["id"]
    return ids


def wait_done(daemon: DaemonProcess, ids: dict[str, str]) -> tuple[dict, int]:
    """Poll until every job ended; the jobs' ``show`` and the most running at once."""
    most = 0
    wanted = set(ids.values())
    while True:
        rows = [r for r in daemon.client.request("ls", all=True) if r["id"] in wanted]
        most = max(most, sum(r["state"] == "running" for r in rows))
        if len(rows) == len(wanted) and all(r["state"] in TERMINAL for r in rows):
            break
        time.sleep(0.5)
    return {name: daemon.client.request("show", id=job_id) for name, job_id in ids.items()}, most


def summary(details: dict, most: int, first: float | None = None) -> dict:
    start = min(d["submit_time"] for d in details.values()) if first is None else first
    ends = [d["end_time"] for d in details.values() if d["end_time"]]
    return {"makespan_s": round(max(ends) - start, 1), "most_at_once": most,
            "oom_crashes": {n: d["oom_crashes"] for n, d in details.items() if d["oom_crashes"]},
            "done": sum(d["state"] == "done" for d in details.values()),
            "durations_s": {n: round(d["end_time"] - d["attempts"][-1]["start"], 1)
                            for n, d in details.items() if d["end_time"] and d["attempts"]},
            "waits_s": {n: round(d["attempts"][0]["start"] - d["submit_time"], 1)
                        for n, d in details.items() if d["attempts"]},
            "completion_s": completion_times(details)}


def completion_times(details: dict) -> dict[str, float | None]:
    """Per job (by name), submission to end for a job that ended done; None otherwise."""
    return {n: round(d["end_time"] - d["submit_time"], 2) if d["state"] == "done" and d["end_time"] else None
            for n, d in details.items()}


def add_versus_exclusive(results: list[dict], exclusive: dict) -> None:
    """Each run's jobs against exclusive's, job by job (``versus_exclusive``), for both batches;
    a run kept by ``--resume`` from before the completion times were recorded gets none."""
    for r in results:
        for batch in ("first", "returning"):
            mine, base = r["daemon"][batch].get("completion_s"), exclusive[batch].get("completion_s")
            if mine is not None and base is not None:
                r["daemon"][batch]["versus_exclusive"] = versus_exclusive(mine, base)[0].as_dict()


def versus_cell(batch: dict) -> str:
    """``p50 / p95 / max (worse)`` of a batch's ratios to exclusive, or - when not measured."""
    v = batch.get("versus_exclusive")
    return "-" if v is None else f"{v['p50']:.2f} / {v['p95']:.2f} / {v['max']:.2f} ({v['worse']})"


def run_daemon(policy: str, sharing: str, root: Path, scale: float) -> dict:
    state, work = root / f"{policy}-{sharing}", root / f"{policy}-{sharing}-work"
    state.mkdir(parents=True)
    (work / "runs").mkdir(parents=True)
    os.environ["FIRST_RUN_SCALE"] = str(scale)
    daemon = DaemonProcess(state, ["--gpus", GPUS, "--policy", policy, "--sharing", sharing],
                           root / f"{policy}-{sharing}.log", name=f"the {policy} daemon")
    try:
        daemon.wait_ready()
        first_details, most = wait_done(daemon, submit_all(daemon, TRACE, work, "first"))
        again = [TRACE[k] for k in RETURNING]
        started = time.time()
        again_details, again_most = wait_done(daemon, submit_all(daemon, again, work, "again"))
    finally:
        daemon.stop(timeout_s=10)
    return {"first": summary(first_details, most),
            "returning": {**summary(again_details, again_most, started),
                          "mem_sources": {n: d["mem_source"] for n, d in again_details.items()},
                          "profile_sources": {n: d["profile"]["source_kind"] for n, d in again_details.items()}}}


def sim_trace(jobs, scale: float, arrival: float = 0.0, tag: str = "") -> list[SimJob]:
    out = []
    for t in jobs:
        estimates = {} if t.declared_mib is None else {"declared": t.declared_mib}
        w = Workload(t.name, 1, t.seconds * scale, t.peak_mib, estimates, JobProfile(t.sm, t.dram),
                     warmup_s=t.warmup_s * scale, startup_s=t.startup_s * scale,
                     command=f"{t.job}|{t.lr}", program=t.job)
        out.append(SimJob(tag + t.name, arrival, w))
    return out


def simulate(policy: str, sharing: str, scale: float) -> dict:
    """The same two batches through the simulator: the first run, then the returning 8 once
    it is done (as the benchmark submits them)."""
    config = SimConfig(sharing=SharingMode(sharing), estimator="declared", profiles="unknown",
                       ramp_s=2.0 * scale)
    first = Simulation(parse_cluster("1xH100-80GB"), sim_trace(TRACE, scale), make_policy(policy), config).run()
    later = first.makespan_s + 1.0
    both = sim_trace(TRACE, scale) + sim_trace([TRACE[k] for k in RETURNING], scale, later, "again-")
    result = Simulation(parse_cluster("1xH100-80GB"), both, make_policy(policy), config).run()
    again = [r for r in result.records if r.id.startswith("again-")]
    return {"first_makespan_s": round(first.makespan_s, 1),
            "returning_makespan_s": round(max(r.end for r in again) - later, 1),
            "oom_crashes": sum(r.oom_crashes for r in first.records)}


def model_floor(jobs, sharing: str, scale: float) -> float:
    """The fluid floor of ``jobs``' work, start-ups and first steps taken out (they overlap)."""
    trace = [SimJob(t.id, 0.0, replace(w, duration_s=w.duration_s - (w.startup_s or 0.0) - w.warmup_s,
                                         startup_s=None, warmup_s=0.0))
             for t in sim_trace(jobs, scale) for w in (t.workload,)]
    return round(floors(trace, parse_cluster("1xH100-80GB"), SharingMode(sharing)).model_floor_s, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every duration (0.25: quick)")
    parser.add_argument("--quick", action="store_true", help="0.25x durations, exclusive and auto-mps only")
    parser.add_argument("--out", type=Path, help="write the results here (a path without suffix) "
                        "instead of benchmarks/results/")
    parser.add_argument("--resume", action="store_true", help="keep the daemon runs an earlier, "
                        "interrupted run of the same day and scale finished (<out>.partial.json)")
    args = parser.parse_args()
    scale = 0.25 if args.quick else args.scale
    runs = QUICK_RUNS if args.quick else RUNS
    today = date.today().isoformat()
    out = args.out or ROOT / "results" / f"first_run-emulated-{today}{'-quick' if args.quick else ''}"
    # what needs no daemon first, so a mistake there costs seconds, not the runs
    sim_only = {f"{p}-{m}": simulate(p, m, scale) for m in ("time-slicing", "mps") for p in (*CARMA, "exclusive")}
    floor = {m: {"first": model_floor(TRACE, m, scale), "returning": model_floor([TRACE[k] for k in RETURNING], m, scale)}
             for m in ("time-slicing", "mps")}
    # each daemon run is kept as it ends (``--resume`` picks them up): a run takes minutes
    partial = out.with_suffix(".partial.json")
    done = json.loads(partial.read_text()) if args.resume and partial.exists() else {}
    if done.get("scale", scale) != scale:
        parser.error(f"{partial} was measured at scale {done['scale']}: drop --resume or pass --scale {done['scale']}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy, sharing in runs:
            key = f"{policy}/{sharing}"
            if key in done.get("runs", {}):
                measured = done["runs"][key]
            else:
                measured = run_daemon(policy, sharing, Path(tmp), scale)
                done = {"scale": scale, "runs": {**done.get("runs", {}), key: measured}}
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(done, indent=1) + "\n")
            predicted = simulate(policy, sharing, scale)
            results.append({"policy": policy, "sharing": sharing, "daemon": measured, "simulator": predicted})
            print(policy, sharing, json.dumps(measured["first"]), json.dumps(predicted), flush=True)
    exclusive = next(r for r in results if r["policy"] == "exclusive")["daemon"]
    base_first = exclusive["first"]["makespan_s"]
    solo = exclusive["first"]["durations_s"]
    base_again = round(sum(solo[TRACE[k].name] for k in RETURNING), 1)
    for r in results:
        d = r["daemon"]
        d["first"]["vs_exclusive"] = round(d["first"]["makespan_s"] / base_first, 3)
        d["returning"]["vs_exclusive"] = round(d["returning"]["makespan_s"] / base_again, 3)
        d["first"]["worst_slowdown"] = round(max(d["first"]["durations_s"][n] / solo[n] for n in solo), 2)
        s = r["simulator"]
        s["first_error"] = round(s["first_makespan_s"] / d["first"]["makespan_s"] - 1.0, 3)
        s["returning_error"] = round(s["returning_makespan_s"] / d["returning"]["makespan_s"] - 1.0, 3)
    add_versus_exclusive(results, exclusive)
    doc = {"machine": "2-core CPU dev machine, no GPU; emulated 1xH100-80GB", "date": today,
           "scale": scale, "trace": [t.__dict__ | {"name": t.name} for t in TRACE],
           "returning": [TRACE[k].name for k in RETURNING], "exclusive_returning_s": base_again,
           "results": results, "simulator_only": sim_only, "model_floor_s": floor}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# First run and returning user on an emulated H100 ({doc['date']})", "",
             f"Issue 29's trace (`benchmarks/first_run_trace.py`), durations x{scale:g}; "
             "`benchmarks/first_run.py`, 2-core CPU dev machine (no GPU). Exclusive: "
             f"{base_first:.1f} s for the first run, {base_again:.1f} s for the returning 8.", "",
             "| sharing | policy | first run | vs excl. | returning | vs excl. | most at once | OOM | worst slowdown "
             "| sim first (err) | sim returning (err) | job/excl. first: p50 / p95 / max (worse) "
             "| returning |", "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        d, s = r["daemon"], r["simulator"]
        lines.append(f"| {r['sharing']} | {r['policy']} | {d['first']['makespan_s']:.1f} | {d['first']['vs_exclusive']:.2f}x "
                     f"| {d['returning']['makespan_s']:.1f} | {d['returning']['vs_exclusive']:.2f}x "
                     f"| {d['first']['most_at_once']} | {d['first']['oom_crashes'] or '-'} | {d['first']['worst_slowdown']:.2f}x "
                     f"| {s['first_makespan_s']:.1f} ({s['first_error']:+.0%}) "
                     f"| {s['returning_makespan_s']:.1f} ({s['returning_error']:+.0%}) "
                     f"| {versus_cell(d['first'])} | {versus_cell(d['returning'])} |")
    lines += ["", "Job by job: each job's completion time (submission to end) over its completion time "
              "under exclusive; worse: over 1 + the tolerance (`collocate.sim.metrics.WORSE_TOLERANCE`), "
              "or not done.", "", "Model floors (start-ups and first steps overlapped, fluid): " +
              ", ".join(f"{m}: first {f['first']:.1f} s ({f['first'] / base_first:.2f}x), returning "
                        f"{f['returning']:.1f} s ({f['returning'] / base_again:.2f}x)" for m, f in floor.items()),
              "", "Simulator only (same trace): " +
              ", ".join(f"{k} {v['first_makespan_s']:.0f} s" for k, v in sim_only.items())]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    partial.unlink(missing_ok=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
