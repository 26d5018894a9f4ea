"""Never worse than a plain queue: issue 35's goals, one seeded scenario each, through real daemons.

Each goal runs its own scenario on emulated A100-40GB GPUs (period 1 s) through fresh daemons
(``collocate serve``) started side by side: the defaults (``auto``) and, where the goal compares
with a plain queue, ``exclusive`` (one job per GPU, unfenced as a plain queue) on the same jobs at the same moments. The jobs
are ``plain_queue_job.py``'s emulated training jobs (start-up, memory ramp, first steps, steady
activity, steps reported): what a job really takes is independent of what it was submitted with.
Every scenario is drawn from ``--seed`` (sizes, durations, activity, arrivals), so a goal is
checked on a case nobody chose:

* **a** under-declared up to 10x: declare 2-4 GiB, need 3-10x that (up to 30 GiB of 40 GB) from
  the first steps; under the defaults with default retries, and again with ``--retries 0``
  (a crash at the attempt's own fence must use no retry). Passes when every job ends ``done``
  under all three daemons.
* **b** memory that grows late: declare what the first steps hold (2-8 GiB), grow 1.5-4x (up to
  30 GiB) at 50-80 % of progress (``--peak-mem``/``--peak-at``). Passes when every job ends done.
* **c** no ``--mem``: need 2-30 GiB, submitted without a declaration. Passes when every job ends done.
* **d** >= 50 mixed jobs (``plain_queue.make_mix``: up to a third overrun their declaration):
  passes with 0 out-of-memory crashes of a job within its commitment (its real need at most what
  the attempt was placed with: a crash then is a neighbour's fault). Beside it: how the daemon
  charged every crash (``show``'s ``oom_crashes`` and ``victim_crashes``).
* **e** GPUs loaded to 35-60 % SM by running jobs: ``sleep 1`` with ``--mem 1GiB`` ends within
  10 s of submission, and a ``--gpus 0`` job starts within 2 s (two daemon rounds: at once).

For a-d it prints the makespan and job by job completion over ``exclusive``
(``collocate.sim.metrics.versus_exclusive``), reported, not judged here (``plain_queue.py``
judges throughput on its trace). A job still running after the scenario's deadline is cancelled
and counts as not done.

Run: ``python benchmarks/never_worse.py [--seed N] [--goals abcde]`` (about 8-10 minutes on a
2-core machine) or ``--quick`` (fewer jobs, shorter, d with 18 jobs: about 2-3 minutes); writes
``benchmarks/results/never_worse-emulated-<date>[-quick].{json,md}`` (or ``--out PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from collocate.daemon.child import DaemonProcess
from collocate.sim.metrics import versus_exclusive

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from _machine import machine  # noqa: E402
from first_run import TERMINAL, completion_times  # noqa: E402
from plain_queue import GIB, MixJob, make_mix, ooms  # noqa: E402

GPU = "A100-40GB"
#: the plain queue: one job per GPU; ``exclusive`` runs nothing beside a job, so it fences nothing
PLAIN = {"serve": ["--policy", "exclusive", "--sharing", "time-slicing"], "submit": {}}
PROBE_S = 10.0  # goal e: the probe ends within this
CPU_START_S = 2.0  # goal e: a CPU job starts within two rounds of the daemon's 1 s period
BUSY_SM = (0.35, 0.6)  # goal e: each GPU's load, as its jobs' solo SM add up


@dataclass(frozen=True)
class Run:
    """One daemon of a scenario: its ``serve`` options and what every submit adds."""

    name: str
    serve: list[str] = field(default_factory=list)
    submit: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    goal: str
    title: str
    gpus: int
    runs: list[Run]
    jobs: list[MixJob]
    deadline_s: float  # after its last arrival, everything has ended or is cancelled


def _job(rng: random.Random, name: str, kind: str, scale: float, arrival_window: float, **memory) -> MixJob:
    sm = rng.uniform(0.15, 0.8)
    return MixJob(name, kind, arrival_s=round(rng.uniform(0.0, arrival_window), 2),
                  seconds=round(rng.uniform(10.0, 18.0) * scale, 2), sm=round(sm, 2),
                  dram=round(sm * rng.uniform(0.3, 0.6), 2), startup_s=round(rng.uniform(1.0, 3.0) * scale, 2),
                  warmup_s=round(rng.uniform(0.5, 1.5) * scale, 2), ramp_s=round(2.0 * scale, 2),
                  peak_at=round(rng.uniform(0.5, 0.8), 2), **memory)


def under_declared(rng: random.Random, n: int, scale: float) -> list[MixJob]:
    jobs = []
    for i in range(n):
        declared = rng.uniform(2.0, 4.0) * GIB
        need = min(30.0 * GIB, declared * rng.uniform(3.0, 10.0))
        jobs.append(_job(rng, f"a{i}", "under", scale, 6.0 * scale, mem_mib=round(need), declared_mib=round(declared)))
    return jobs


def grows_late(rng: random.Random, n: int, scale: float) -> list[MixJob]:
    jobs = []
    for i in range(n):
        first = rng.uniform(2.0, 8.0) * GIB
        peak = min(30.0 * GIB, first * rng.uniform(1.5, 4.0))
        jobs.append(_job(rng, f"b{i}", "late", scale, 6.0 * scale, mem_mib=round(first),
                         declared_mib=round(first), peak_mib=round(peak)))
    return jobs


def undeclared(rng: random.Random, n: int, scale: float) -> list[MixJob]:
    return [_job(rng, f"c{i}", "no-mem", scale, 6.0 * scale, mem_mib=round(rng.uniform(2.0, 30.0) * GIB),
                 declared_mib=None) for i in range(n)]


def busy(rng: random.Random, gpus: int, scale: float) -> list[MixJob]:
    """Two long jobs a GPU whose solo SM adds up to ``BUSY_SM``; memory leaves room for 1 GiB."""
    jobs = []
    for g in range(gpus):
        total = rng.uniform(*BUSY_SM)
        share = rng.uniform(0.3, 0.7)
        for k, sm in enumerate((total * share, total * (1 - share))):
            jobs.append(MixJob(f"e-busy{g}{k}", "honest", arrival_s=0.0, seconds=round(60.0 * scale, 1),
                               mem_mib=(need := round(rng.uniform(4.0, 14.0) * GIB)), declared_mib=round(need * 1.02),
                               sm=round(sm, 2), dram=round(sm * 0.4, 2), ramp_s=1.0))
    return jobs


def scenarios(seed: int, quick: bool) -> list[Scenario]:
    scale = 0.5 if quick else 1.0
    rng = random.Random(seed)
    small = 4 if quick else 6
    both = [Run("exclusive", **PLAIN), Run("auto")]
    mixed = [j for j in make_mix(18 if quick else 54, cpu=0, scale=0.35 if quick else 0.5, seed=seed)
             if j.kind != "probe"]
    return [
        Scenario("a", "under-declared up to 10x", 2,
                 [*both, Run("auto --retries 0", submit={"retries": 0})],
                 under_declared(rng, small, scale), 240.0 * scale),
        Scenario("b", "memory that grows late", 2, both, grows_late(rng, small, scale), 200.0 * scale),
        Scenario("c", "no --mem", 2, both, undeclared(rng, small, scale), 200.0 * scale),
        Scenario("d", f"{len(mixed)} mixed jobs, "
                 f"{sum(j.overruns for j in mixed)} overrun their declaration", 4, both, mixed,
                 300.0 if quick else 420.0),
        Scenario("e", "a small job and a CPU job beside busy GPUs", 2, [Run("auto")], busy(rng, 2, scale),
                 60.0 * scale),
    ]


def start_daemons(scenario: Scenario, root: Path) -> dict[str, DaemonProcess]:
    daemons = {}
    for k, r in enumerate(scenario.runs):
        daemons[r.name] = DaemonProcess(root / f"{scenario.goal}{k}", [
            "--gpus", f"emulated:{scenario.gpus}x{GPU}", *r.serve], root / f"{scenario.goal}{k}.log",
            name=f"the {r.name} daemon of scenario {scenario.goal}")
    for daemon in daemons.values():
        daemon.wait_ready()
    return daemons


def submit(daemon: DaemonProcess, job: MixJob, work: Path, extra: dict) -> str:
    return daemon.client.request(
        "submit", argv=job.argv(), gpus=job.gpus, name=job.name, cwd=str(work),
        mem=None if job.declared_mib is None else f"{job.declared_mib:.0f}MiB",
        base_env=dict(os.environ), **extra)["id"]


def wait_all(daemon: DaemonProcess, ids: dict[str, str], until: float) -> dict:
    """Poll until every job ended or ``until`` (then cancel what is left); their ``show``."""
    wanted = set(ids.values())
    while time.monotonic() < until:
        rows = [r for r in daemon.client.request("ls", all=True) if r["id"] in wanted]
        if len(rows) == len(wanted) and all(r["state"] in TERMINAL for r in rows):
            break
        time.sleep(0.5)
    else:
        for job_id in wanted:
            daemon.client.request("cancel", id=job_id)
        time.sleep(2.0)
    return {name: daemon.client.request("show", id=job_id) for name, job_id in ids.items()}


def charges(details: dict) -> dict:
    """How the daemon charged each job's out-of-memory crashes: to itself (``oom_crashes``,
    its requirement raised, a retry used) or to a neighbour (``victim_crashes``)."""
    return {n: {"own": d["oom_crashes"], "neighbour": d.get("victim_crashes", 0)} for n, d in details.items()
            if d["oom_crashes"] or d.get("victim_crashes")}


def measure(details: dict, jobs: dict[str, MixJob]) -> dict:
    ends = [d["end_time"] for d in details.values() if d["end_time"]]
    first = min(d["submit_time"] for d in details.values())
    return {
        "not_done": {n: f"{d['state']}: {d.get('reason') or ''}"[:240] for n, d in details.items()
                     if d["state"] != "done"},
        "attempts": {n: len(d["attempts"]) for n, d in details.items()},
        "crashed": {n: [f"{a['outcome']}: placed with {a['mem_mib'] and round(a['mem_mib'])} MiB, held "
                        f"{a['peak_mib'] and round(a['peak_mib'])}; {a['reason']}"[:200] for a in d["attempts"]]
                    for n, d in details.items() if any(a["outcome"] == "oom" for a in d["attempts"])},
        "oom": ooms(details, jobs),
        "charged": charges(details),
        "makespan_s": round(max(ends) - first, 1) if ends else None,
        "completion_s": completion_times(details),
    }


def run_queue_scenario(scenario: Scenario, root: Path) -> dict:
    """a-d: the jobs at their arrival times to every daemon; each daemon's ``measure``."""
    work = root / "work"
    work.mkdir(exist_ok=True)
    jobs = {j.name: j for j in scenario.jobs}
    daemons = start_daemons(scenario, root)
    try:
        ids: dict[str, dict[str, str]] = {r.name: {} for r in scenario.runs}
        t0 = time.monotonic()
        for job in sorted(scenario.jobs, key=lambda j: (j.arrival_s, j.name)):
            time.sleep(max(0.0, t0 + job.arrival_s - time.monotonic()))
            for r in scenario.runs:
                ids[r.name][job.name] = submit(daemons[r.name], job, work, r.submit)
        until = time.monotonic() + scenario.deadline_s
        results = {r.name: measure(wait_all(daemons[r.name], ids[r.name], until), jobs) for r in scenario.runs}
    finally:
        for daemon in daemons.values():
            daemon.stop(timeout_s=10)
    base = results.get("exclusive", {}).get("completion_s")
    for name, r in results.items():
        if base and name != "exclusive":
            r["versus_exclusive"] = versus_exclusive(r["completion_s"], base)[0].as_dict()
            if r["makespan_s"] and results["exclusive"]["makespan_s"]:
                r["makespan_over_exclusive"] = round(r["makespan_s"] / results["exclusive"]["makespan_s"], 2)
    return results


def run_probe_scenario(scenario: Scenario, root: Path) -> dict:
    """e: load the GPUs, wait until they read it, then the probe and a CPU job."""
    work = root / "work"
    work.mkdir(exist_ok=True)
    daemons = start_daemons(scenario, root)
    daemon = daemons["auto"]
    try:
        for job in scenario.jobs:
            submit(daemon, job, work, {})
        until = time.monotonic() + 30.0
        readings: list[float] = []
        while time.monotonic() < until:  # every busy job running and its GPU reading it
            rows = daemon.client.request("gpus")
            readings = [r["sm_recent"] or 0.0 for r in rows]
            running = [r for r in daemon.client.request("ls") if r["state"] == "running"]
            if len(running) == len(scenario.jobs) and min(readings) >= BUSY_SM[0] * 0.8:
                break
            time.sleep(0.5)
        probe = MixJob("probe", "probe", 0.0, 1.0, 0.0, GIB)
        cpu = MixJob("cpu", "cpu", 0.0, 1.0, 0.0, None)
        ids = {"probe": submit(daemon, probe, work, {}), "cpu": submit(daemon, cpu, work, {})}
        details = wait_all(daemon, ids, time.monotonic() + scenario.deadline_s)
        rows = daemon.client.request("gpus")
        busy_running = sum(r["state"] == "running" for r in daemon.client.request("ls"))
    finally:
        daemon.stop(timeout_s=10)
    p, c = details["probe"], details["cpu"]
    return {"auto": {
        "gpu_sm_at_submit": sorted(round(x, 2) for x in readings),
        "gpu_free_gib": sorted(round(r["free_mib"] / GIB, 1) for r in rows if r.get("free_mib") is not None),
        "busy_still_running": busy_running,
        "probe_end_s": round(p["end_time"] - p["submit_time"], 1) if p["end_time"] else None,
        "probe_state": p["state"], "probe_reason": p.get("reason"),
        "cpu_start_s": round(c["attempts"][0]["start"] - c["submit_time"], 1) if c["attempts"] else None,
        "cpu_state": c["state"],
    }}


def verdict(goal: str, results: dict) -> tuple[bool, str]:
    """Whether the goal held, and the figures that say so."""
    if goal in "abc":
        parts = [f"{name}: {len(r['completion_s']) - len(r['not_done'])}/{len(r['completion_s'])} done, "
                 f"{sum(r['attempts'].values())} attempts" for name, r in results.items()]
        return all(not r["not_done"] for r in results.values()), "; ".join(parts)
    if goal == "d":
        auto = results["auto"]
        within, overran = auto["oom"]["within_commitment"], auto["oom"]["overran"]
        return not within, (f"auto: {len(within)} OOM crashes within commitment{f' {within}' if within else ''}, "
                            f"{len(overran)} of overrunning jobs; "
                            f"{len(auto['completion_s']) - len(auto['not_done'])}/{len(auto['completion_s'])} done")
    e = results["auto"]
    ok = (e["probe_end_s"] is not None and e["probe_end_s"] <= PROBE_S and e["cpu_start_s"] is not None
          and e["cpu_start_s"] <= CPU_START_S)
    return ok, (f"probe ended after {e['probe_end_s']} s (<= {PROBE_S:g}), CPU job started after "
                f"{e['cpu_start_s']} s (<= {CPU_START_S:g}); GPUs read "
                f"{', '.join(f'{x:.0%}' for x in e['gpu_sm_at_submit'])} SM at submission")


def report(doc: dict) -> str:
    m = doc["machine"]
    lines = [f"# Never worse than a plain queue: issue 35's goals, one scenario each ({m['date']})", "",
             f"`python benchmarks/never_worse.py{doc['command']}`; {m['host_cpu']}, {m['cores']} cores "
             f"(shared), no GPU; emulated {GPU} GPUs (period 1 s); seed {doc['seed']}; load average (1 min) "
             f"{doc['load_average']['start'][0]} at the start, {doc['load_average']['end'][0]} at the end; "
             f"{doc['wall_s']:.0f} s in all.", "",
             "| goal | scenario | result | measured |", "|---|---|---|---|"]
    for s in doc["scenarios"]:
        lines.append(f"| {s['goal']} | {s['title']} ({s['gpus']} GPUs) | {'PASS' if s['pass'] else 'FAIL'} "
                     f"| {s['measured']} |")
    for s in doc["scenarios"]:
        lines += ["", f"## {s['goal']}: {s['title']}", ""]
        for name, r in s["results"].items():
            if "makespan_s" in r:
                v = r.get("versus_exclusive")
                lines.append(
                    f"- {name}: makespan {r['makespan_s']} s"
                    + (f" ({r['makespan_over_exclusive']}x exclusive)" if "makespan_over_exclusive" in r else "")
                    + (f"; completion / exclusive p50 {v['p50']}, p95 {v['p95']}, max {v['max']}, "
                       f"{v['worse']} worse off" if v else "")
                    + f"; attempts {sum(r['attempts'].values())} for {len(r['attempts'])} jobs; OOM crashes "
                    f"within commitment {len(r['oom']['within_commitment'])}, overran "
                    f"{len(r['oom']['overran'])}; charged by the daemon: "
                    + (", ".join(f"{n} {c['own']} own / {c['neighbour']} a neighbour's"
                                 for n, c in r["charged"].items()) or "none"))
                for n, why in r["not_done"].items():
                    lines.append(f"  - not done: {n}: {why}")
                if len(s["jobs"]) <= 8:
                    lines += [f"  - {n}'s attempts: " + " / ".join(a) for n, a in r.get("crashed", {}).items()]
            else:
                lines.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
        jobs = s["jobs"]
        kinds = {k: sum(j["kind"] == k for j in jobs) for k in ("honest", "late", "under", "no-mem")}
        lines.append("- jobs: " + "; ".join(
            f"{j['name']} declares {'-' if j['declared_mib'] is None else round(j['declared_mib'] / GIB, 1)}, "
            f"needs {round(j['need_mib'] / GIB, 1)} GiB" + (f" from {j['peak_at']:.0%}" if j["peak_mib"] else "")
            + f", {j['seconds']} s" for j in jobs) if len(jobs) <= 8 else
            f"- jobs: {len(jobs)} ({', '.join(f'{v} {k}' for k, v in kinds.items())}), "
            f"{sum(j['overruns'] for j in jobs)} overrun their declaration (full list in the .json)")
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    text = report(doc)
    out.with_suffix(".md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter jobs; d with 18 (about 2-3 minutes)")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--goals", default="abcde", help="which goals' scenarios to run (default: abcde)")
    parser.add_argument("--out", type=Path, help="write <out>.json and <out>.md instead of benchmarks/results/")
    args = parser.parse_args()
    if not args.goals or not set(args.goals) <= set("abcde"):
        parser.error(f"--goals takes letters of abcde, not {args.goals!r}")
    info = machine()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run stops its daemons
    load = [round(x, 1) for x in os.getloadavg()]
    out = args.out or ROOT / "results" / f"never_worse-emulated-{info['date']}{'-quick' if args.quick else ''}"
    started = time.time()
    command = " ".join(sys.argv[1:])
    doc = {"machine": info, "seed": args.seed, "quick": args.quick, "command": f" {command}" if command else "",
           "load_average": {"start": load}, "scenarios": []}
    for s in scenarios(args.seed, args.quick):
        if s.goal not in args.goals:
            continue
        begun = time.time()  # a job's processes may still write as its daemon stops: no cleanup error
        with tempfile.TemporaryDirectory(prefix=f"never-worse-{s.goal}-", ignore_cleanup_errors=True) as tmp:
            results = (run_probe_scenario if s.goal == "e" else run_queue_scenario)(s, Path(tmp))
        ok, measured = verdict(s.goal, results)
        print(f"{s.goal} {'PASS' if ok else 'FAIL'} ({s.title}, {time.time() - begun:.0f} s): {measured}", flush=True)
        doc["scenarios"].append({
            "goal": s.goal, "title": s.title, "gpus": s.gpus, "pass": ok, "measured": measured,
            "runs": [asdict(r) for r in s.runs], "results": results,
            "jobs": [asdict(j) | {"need_mib": round(j.need_mib), "overruns": j.overruns} for j in s.jobs]})
        doc["wall_s"] = round(time.time() - started, 1)
        doc["load_average"]["end"] = [round(x, 1) for x in os.getloadavg()]
        text = write(doc, out)  # after each scenario: a stopped run keeps what it measured
    print(text)
    print(f"wrote {out.with_suffix('.md')} and .json ({doc['wall_s']:.0f} s)")
    sys.exit(0 if all(s["pass"] for s in doc["scenarios"]) else 1)


if __name__ == "__main__":
    main()
