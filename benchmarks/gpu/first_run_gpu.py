"""Issue 16's evidence on a real GPU: a first run of real training jobs without history.

What a new user does, step by step, on one H100/H200:

1. **the trace** (``TRACE``): 14 training jobs of model families that are not collocate's
   built-in workloads (``first_run_job.py``), sweep points included; each job's step count is sized
   from a short solo timing of its model (``first_run_job.py --calibrate``, one process), so it
   trains ``--train-s`` seconds alone (about 18-20 s alone with start-up);
2. **memory from ``collocate estimate``**, the real command line, for every job;
3. **all jobs submitted at once** to a fresh ``collocate serve --gpus nvml`` (private state
   directory) as ``collocate submit --estimate <entry> --batch-size B --precision P --gpu-type T``
   submits them: the request carries step 2's estimate as an estimate (``mem_source``
   ``static-…``, ``collocate.client.cli.estimate_fields``), which the daemon commits only until
   the job's own peak holds still. They go through the daemon's API so that a run does not
   estimate every job again (tens of seconds of device time per run); one job is submitted with
   no memory and one declaring half its estimate (``collocate submit --mem``);
4. runs, each on a fresh daemon with an empty history: ``exclusive`` (the baseline, measured in
   the same call) and ``auto`` (the default daemon: ``--sharing auto``, MPS for one user), whose
   same user then **submits the first 8 jobs again with new output paths** (``--out
   runs/again/...``) to the same daemon, whose history should find them by their identity
   (issue 29); optional runs ``auto-mps``, ``auto-ts``, ``carma-magm-mps``, and the second
   submission of the same commands with the history of the exclusive run (its
   ``collocate.common.sqlite`` copied into a fresh state directory: memory and solo activity measured
   there): ``auto-mps-history`` and ``exclusive-history``.

Jobs run from one fixed working directory (``WORKDIR``, a copy of ``first_run_job.py``), so the
same command has the same signature on a later machine and the history matches it.

Per run it records makespan, mean JCT, most jobs running at once, OOM crashes and whether each was
recovered, every job's end state, per-job peak (NVML, from the daemon's attempts) against its
estimate and declaration, and the daemon's ``ls`` rows (state, reason, wait) every
``--snapshot-s`` seconds. ``--out`` gets ``summary.json``, ``summary.md``, ``trace.json``,
``history.sqlite`` (after the exclusive run) and one folder per run (``snapshots.jsonl``,
``jobs.json``, ``daemon.log``, ``job-logs/``: the end of each attempt's output). The simulator's prediction for
the first runs uses the exclusive
run's measured solo durations, peaks and activities (``--profiles unknown``: what a fresh daemon
knows); without an exclusive run in the folder it is skipped with a note.

Device time: the default ``--runs exclusive,auto`` with ``--train-s 6`` is one call of about
8 minutes on an H100 (14 jobs of 6 s training and ~10 s start-up each: exclusive ~4 min, the
first run and the resubmission ~3 min); the other runs need a call of their own (``--from`` an
earlier call's folder reuses its trace and history). Every run is skipped, with a note, when
``--budget-s`` cannot hold it; ``--quick`` trains 12 jobs for 5 s each. ``--dry-run`` does it all
on the CPU: emulated H100, 3 tiny plain-PyTorch jobs holding their estimate of emulated memory
(``FIRST_RUN_EMULATED_MIB``, outside the command, so not in its identity).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collocate.bench.minitrace_run import cancel_all
from collocate.client.cli import estimate_fields
from collocate.daemon.child import DaemonProcess
from collocate.estimate.base import Estimate

HERE = Path(__file__).resolve().parent
JOB_SCRIPT = HERE / "first_run_job.py"
WORKDIR = Path(tempfile.gettempdir()) / "collocate-first-run"  # the jobs' cwd: same on every machine
TERMINAL = ("done", "failed", "cancelled", "rejected")
RUNS = {  # name: (policy, sharing, with the exclusive run's history)
    "exclusive": ("exclusive", "time-slicing", False),
    # the default daemon (`--sharing auto`: MPS for one user), then the same user resubmits
    # RESUBMIT jobs with new output paths to the same daemon (issue 29)
    "auto": ("auto", "auto", False),
    "auto-mps": ("auto", "mps", False),
    "auto-ts": ("auto", "time-slicing", False),
    "carma-magm-mps": ("carma-magm", "mps", False),
    "auto-mps-history": ("auto", "mps", True),
    "exclusive-history": ("exclusive", "time-slicing", True),
}
# (model, batch size, lr): 14 jobs of 3.2-6.6 GiB by `collocate estimate --gpu H100-80GB` (2-core
# CPU dev machine, torch 2.15 CPU), about 72 GiB together.
TRACE = [
    ("convnext-nano", 64, 1e-3), ("efficientnet-b0", 56, 1e-3), ("mobilenet-v3-large", 96, 1e-3),
    ("resnet34", 128, 0.1), ("bert-small", 48, 1e-4), ("gpt2-small", 12, 3e-4), ("gpt2-small", 12, 1e-4),
    ("llama-8l", 8, 3e-4), ("lstm", 64, 1e-3), ("lstm", 64, 3e-4), ("unet", 12, 1e-3), ("mlp", 1024, 1e-3),
    ("mlp", 1024, 3e-4), ("mlp", 1024, 1e-4),
]
QUICK = [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12]  # 12 jobs: one GPT-2 and one MLP sweep point fewer
DRY = [("mlp-tiny", 16, 1e-3), ("mlp-tiny", 16, 3e-4), ("unet-tiny", 2, 1e-3)]  # two estimates: light
RESUBMIT = 8  # jobs the returning user submits again (the first 8, with new output paths)
NO_MEM, UNDER = "lstm", "resnet34"  # the job submitted without --mem; the one declaring half (first of each)
STARTUP_S = 10.0  # import + CUDA context per job, measured 9-13 s on an H100 (RUNBOOK, round A)


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "collocate.cli", *args]


# ---------------------------------------------------------------- the trace


def prepare(out: Path, *, dry: bool, quick: bool, train_s: float, gpu_type: str, job_python: str) -> dict[str, Any]:
    """Time each model alone, size its steps, and estimate every job's memory with the CLI."""
    chosen = DRY if dry else [TRACE[i] for i in QUICK] if quick else TRACE
    if dry:
        train_s = min(train_s, 2.0)  # the daemon samples each second: a peak needs a few
    pairs = sorted({(m, b) for m, b, _ in chosen})
    calib = subprocess.run([sys.executable, str(WORKDIR / "first_run_job.py"), "--calibrate",
                            ",".join(f"{m}:{b}" for m, b in pairs), "--warmup", "2" if dry else "5",
                            "--timed", "2" if dry else "10"],
                           cwd=WORKDIR, capture_output=True, text=True, check=False)
    if calib.returncode != 0:
        raise SystemExit(f"calibration failed:\n{calib.stderr[-3000:]}")
    step_s = {(r["model"], r["batch_size"]): r for r in json.loads(calib.stdout.strip().splitlines()[-1])}
    estimates = estimate_all(pairs, gpu_type=gpu_type, dry=dry)
    jobs = []
    special = {NO_MEM: "no --mem", UNDER: "half its estimate"} if not dry else \
        {1: "no --mem", 2: "half its estimate"}  # the dry run's second MLP point, its U-Net
    for k, (model, batch, lr) in enumerate(chosen):
        cal, est = step_s[(model, batch)], estimates[(model, batch)]
        steps = max(3, round(train_s / max(cal["step_s"], 1e-4)))
        declared: float | None = est["mib"]
        declare = "--estimate"
        if (k if dry else model) in special:
            declare = special.pop(k if dry else model)
            declared = None if declare == "no --mem" or declared is None else round(declared / 2)
        if est["mib"] is None:
            declare = "no --mem: the estimate failed"
        jobs.append({"name": f"{model}-{k:02d}", "model": model, "batch_size": batch, "lr": lr,
                     "steps": steps, "solo_step_s": round(cal["step_s"], 5),
                     "calib_reserved_mib": cal["torch_reserved_peak_mib"],
                     "estimate_mib": est["mib"], "estimate_upper_mib": est.get("upper_mib"),
                     "estimate_method": est.get("method"), "estimate_uncertainty": est.get("uncertainty"),
                     "estimate_command": est["command"],
                     "estimate_error": est.get("error"), "declared": declare,
                     "declared_mib": declared,
                     "argv": [job_python, "first_run_job.py", "--model", model, "--batch-size",
                              str(batch), "--steps", str(steps), "--lr", f"{lr:g}",
                              "--out", f"runs/first/{model}-{k:02d}.json"]})
    trace = {"workdir": str(WORKDIR), "train_s": train_s, "gpu_type": gpu_type, "jobs": jobs}
    (out / "trace.json").write_text(json.dumps(trace, indent=1) + "\n")
    return trace


def estimate_all(pairs: list[tuple[str, int]], *, gpu_type: str, dry: bool) -> dict[tuple[str, int], dict]:
    """``collocate estimate <entry> -b B --gpu T --format json`` per (model, batch), a few at once."""
    sys.path.insert(0, str(WORKDIR))
    from first_run_job import MODELS, entry_point  # the copy the jobs run

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKDIR), os.environ.get("PYTHONPATH", "")])}

    def one(pair: tuple[str, int]) -> dict:
        model, batch = pair
        argv = cli("estimate", entry_point(model), "--batch-size", str(batch), "--gpu", gpu_type,
                   "--precision", MODELS[model].precision, "--format", "json")
        t = time.monotonic()
        res = subprocess.run(argv, cwd=WORKDIR, env=env, capture_output=True, text=True, check=False)
        command = " ".join(["collocate", *argv[3:]])
        if res.returncode != 0:  # as a user would, submit without --mem; the summary says why
            log(f"`{command}` failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
            return {"mib": None, "method": None, "error": res.stderr.strip()[-500:], "command": command}
        est = json.loads(res.stdout)
        log(f"estimate {model} b{batch}: {est['mib']:.0f} MiB ({est['method']}, {time.monotonic() - t:.0f} s)")
        return {"mib": round(est["mib"]), "upper_mib": est.get("upper_mib"), "method": est.get("method"),
                "uncertainty": est.get("uncertainty"), "command": command}

    with ThreadPoolExecutor(len(pairs) if dry else 6) as pool:
        return dict(zip(pairs, pool.map(one, pairs), strict=True))


# ---------------------------------------------------------------- one run


def run_one(name: str, trace: dict[str, Any], out: Path, *, gpus: str, dry: bool, history: Path | None,
            timeout_s: float, snapshot_s: float, settle: list[str]) -> dict[str, Any]:
    policy, sharing, _ = RUNS[name]
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="cfr-"))  # short: the API socket lives here
    if history is not None:
        shutil.copy(history, state / "collocate.common.sqlite")
    serve = ["--gpus", gpus, "--policy", policy, "--sharing", sharing, "--verbose"]
    for p in settle:
        serve += ["--param", p]
    daemon = DaemonProcess(state, serve, run_dir / "daemon.log", name=f"the {name} daemon", client_timeout_s=30)
    snaps = open(run_dir / "snapshots.jsonl", "w")
    most, timed_out, again = 0, False, None
    t0 = time.monotonic()

    def submit(jobs: list[dict], batch: str) -> dict[str, dict]:
        """Submit ``jobs`` as a user would; their output paths under ``runs/<batch>/``."""
        ids: dict[str, dict] = {}
        procs, estimated = [], []
        for job in jobs:
            job = {**job, "argv": [a.replace("runs/first/", f"runs/{batch}/") for a in job["argv"]]}
            env = []
            if dry and job["estimate_mib"]:  # the tiny CPU job holds its estimate on the emulated GPU (not in the signature)
                env += [f"FIRST_RUN_EMULATED_MIB={job['estimate_mib']}"]
            if dry:  # CPU jobs side by side: one thread each, or their OpenMP threads spin against
                env += ["OMP_NUM_THREADS=1"]  # each other (two took 60-90 s, not 5, on 2 cores)
            if job["declared"] == "--estimate" and job.get("estimate_uncertainty") is not None:
                estimated.append((job, env))  # below, as `submit --estimate` sends it
                continue
            mem = [] if job["declared_mib"] is None else ["--mem", f"{job['declared_mib']}MiB"]
            argv = cli("submit", "--state-dir", str(state), *mem, *(a for e in env for a in ("--env", e)),
                       "--name", job["name"], "--cwd", trace["workdir"], "--", *job["argv"])
            procs.append((job, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        for job, env in estimated:
            est = Estimate(float(job["estimate_mib"]), job["estimate_method"], float(job["estimate_uncertainty"]))
            ids[daemon.client.request("submit", argv=job["argv"], name=job["name"], gpus=1, cwd=trace["workdir"],
                                      env=env, base_env=dict(os.environ), **estimate_fields(est))["id"]] = job
        for job, proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise SystemExit(f"collocate submit {job['name']} exited {proc.returncode}: {stderr.strip()}")
            ids[stdout.strip().splitlines()[-1]] = job
        log(f"{name}: submitted {len(ids)} jobs of {batch} ({policy}, {sharing}{', with history' if history else ''})")
        return ids

    def wait(ids: dict[str, dict]) -> list[dict]:
        """Poll until ``ids`` have ended (or the budget is spent: cancel them); their details."""
        nonlocal most, timed_out
        last_snap = 0.0
        while True:
            rows = [r for r in daemon.client.request("ls", all=True) if r["id"] in ids]
            running = sum(r["state"] == "running" for r in rows)
            most = max(most, running)
            now = time.monotonic()
            if now - last_snap >= snapshot_s:
                last_snap = now
                snaps.write(json.dumps({"t": round(now - t0, 1), "rows": [
                    {k: r.get(k) for k in ("id", "name", "state", "reason", "wait", "mem_mib", "mem_source",
                                           "oom_crashes", "on")} for r in rows]}) + "\n")
                snaps.flush()
            if all(r["state"] in TERMINAL for r in rows):
                break
            if now - t0 > timeout_s:
                timed_out = True
                log(f"{name}: timeout after {timeout_s:.0f} s; cancelling the jobs that have not ended")
                for r in rows:
                    if r["state"] not in TERMINAL:
                        daemon.client.request("cancel", id=r["id"])
                end = time.monotonic() + 25
                while time.monotonic() < end and not all(
                        r["state"] in TERMINAL for r in daemon.client.request("ls", all=True) if r["id"] in ids):
                    time.sleep(1)
                break
            time.sleep(0.5)
        return [daemon.client.request("show", id=i) for i in ids]

    try:
        daemon.wait_ready()
        ids = submit(trace["jobs"], "first")
        details = wait(ids)
        if sharing == "auto" and not timed_out:  # the returning user: new output paths, same daemon
            again_ids = submit(trace["jobs"][:RESUBMIT], "again")
            again_details = wait(again_ids)
            again = summarize(name, again_details, again_ids, most=0, timed_out=timed_out)
    except BaseException:
        # Interrupted (round.sh's step limit sends SIGINT) or failed: the jobs run in their own
        # sessions and would outlive the daemon, so cancel them first.
        cancel_all(daemon, log)
        raise
    finally:
        snaps.close()
        daemon.stop()
    (run_dir / "jobs.json").write_text(json.dumps(details, indent=1) + "\n")
    keep_logs(details, run_dir / "job-logs")
    summary = summarize(name, details, ids, most=most, timed_out=timed_out)
    summary["resolved_sharing"] = resolved_sharing(run_dir / "daemon.log", sharing)
    if again is not None:
        summary["again"] = again
    if name == "exclusive":  # the history of the second submission
        copy_db(state / "collocate.common.sqlite", out / "history.sqlite")
    shutil.rmtree(state, ignore_errors=True)
    return summary


def resolved_sharing(log_path: Path, asked: str) -> str:
    """What ``--sharing auto`` chose, from the daemon's start-up line."""
    if asked != "auto":
        return asked
    import re

    found = re.search(r"sharing (time-slicing|mps) \(", log_path.read_text(errors="replace"))
    return found.group(1) if found else "time-slicing"


def keep_logs(details: list[dict], dest: Path, tail: int = 4096) -> None:
    """The end of each attempt's stdout and stderr (the job's JSON result, or its traceback): the
    state directory they live in is removed after the run."""
    dest.mkdir(exist_ok=True)
    for d in details:
        for a in d.get("attempts") or []:
            for kind in ("stdout", "stderr"):
                src = Path(a["dir"]) / f"{kind}.log"
                if src.is_file() and src.stat().st_size:
                    data = src.read_bytes()[-tail:]
                    (dest / f"{d['name']}-{a['n']}.{kind}").write_bytes(data)


def copy_db(src: Path, dst: Path) -> None:
    """A consistent copy of the daemon's database, its write-ahead log folded in."""
    dst.unlink(missing_ok=True)
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def summarize(name: str, details: list[dict], ids: dict[str, dict], *, most: int, timed_out: bool) -> dict[str, Any]:
    policy, sharing, history = RUNS[name]
    jobs = []
    for d in details:
        job = ids[d["id"]]
        attempts = d.get("attempts") or []
        peaks = [a["peak_mib"] for a in attempts if a.get("peak_mib")]
        done = [a for a in attempts if a.get("outcome") == "succeeded" and a.get("end")]
        jobs.append({
            "name": d["name"], "state": d["state"], "declared": job["declared"],
            "declared_mib": job["declared_mib"], "estimate_mib": job["estimate_mib"],
            "mem_mib": d["mem_mib"], "mem_source": d["mem_source"], "peak_mib": max(peaks) if peaks else None,
            "peak_vs_estimate": round(max(peaks) / job["estimate_mib"], 3) if peaks and job["estimate_mib"] else None,
            "attempts": len(attempts), "oom_crashes": d["oom_crashes"],
            "solo_sm": next((a["solo_sm"] for a in reversed(attempts) if a.get("solo_sm") is not None), None),
            "solo_dram": next((a["solo_dram"] for a in reversed(attempts) if a.get("solo_dram") is not None), None),
            "profile": d.get("profile"),
            "last_run_s": round(done[-1]["end"] - done[-1]["start"], 1) if done else None,
            "submit_time": d["submit_time"], "end_time": d["end_time"],
        })
    ends = [j["end_time"] for j in jobs if j["end_time"]]
    first = min(j["submit_time"] for j in jobs)
    done = [j for j in jobs if j["state"] == "done"]
    return {"run": name, "policy": policy, "sharing": sharing, "history": history, "jobs": len(jobs),
            "done": len(done), "timed_out": timed_out, "most_at_once": most,
            "makespan_s": round(max(ends) - first, 1) if ends else None,
            "mean_jct_s": round(sum(j["end_time"] - j["submit_time"] for j in done) / len(done), 1) if done else None,
            "oom_crashes": sum(j["oom_crashes"] for j in jobs),
            "oom_recovered": sum(j["oom_crashes"] > 0 and j["state"] == "done" for j in jobs),
            "oom_jobs": sum(j["oom_crashes"] > 0 for j in jobs), "per_job": jobs}


# ---------------------------------------------------------------- the simulator, for comparison


def simulate(runs: list[dict], gpu_type: str) -> tuple[list[dict], str]:
    """The simulator on the same trace, from the exclusive run's measured solo behaviour."""
    solo = next((r for r in runs if r["run"] == "exclusive"), None)
    if solo is None or solo["done"] < solo["jobs"]:
        return [], "simulator comparison skipped: needs a complete exclusive run in this folder"
    from collocate.core.gputypes import parse_cluster
    from collocate.core.model import JobProfile, SharingMode
    from collocate.core.policies import make_policy
    from collocate.sim.engine import SimConfig, Simulation
    from collocate.sim.trace import TraceJob, Workload

    trace = []
    for j in solo["per_job"]:
        est = {} if j["declared_mib"] is None else {"declared": float(j["declared_mib"])}
        if j["declared"] == "--estimate" and j["estimate_mib"]:  # an estimate, given way to the peak once still
            est = {"static": float(j["estimate_mib"])}
        prof = JobProfile(j["solo_sm"] if j["solo_sm"] is not None else 0.5,
                          j["solo_dram"] if j["solo_dram"] is not None else 0.2)
        w = Workload(j["name"], 1, j["last_run_s"], float(j["peak_mib"] or j["estimate_mib"] or 0.0), est, prof)
        trace.append(TraceJob(j["name"], 0.0, w))
    out = []
    for r in runs:
        if r["history"]:
            continue
        cfg = SimConfig(sharing=SharingMode(r.get("resolved_sharing", r["sharing"])), estimator="static",
                        profiles="unknown")
        res = Simulation(parse_cluster(f"1x{gpu_type}"), trace, make_policy(r["policy"]), cfg).run()
        jct = [x.end - x.submit for x in res.records if x.end is not None]
        out.append({"run": r["run"], "makespan_s": round(res.makespan_s, 1),
                    "mean_jct_s": round(sum(jct) / len(jct), 1) if jct else None})
    return out, "simulator: the exclusive run's solo durations (start-up included), NVML peaks and solo activity"


# ---------------------------------------------------------------- report


def environment(dry: bool) -> dict[str, Any]:
    from collocate.bench.envinfo import environment as env

    info = env("cpu" if dry else "cuda")
    if dry:
        info["note"] = "DRY RUN on a CPU, emulated 1xH100-80GB, tiny jobs: not GPU measurements"
    return info


def report(out: Path, env: dict, trace: dict, runs: list[dict], sims: list[dict], notes: list[str]) -> None:
    excl = {False: None, True: None}
    for r in runs:
        if r["policy"] == "exclusive" and r["done"] == r["jobs"]:
            excl[r["history"]] = r["makespan_s"]
    base_first = excl[False]
    base_second = excl[True] or excl[False]  # exclusive gains nothing from history but the no-mem job's size
    goals = []
    solo = next(({j["name"]: j["last_run_s"] for j in r["per_job"]} for r in runs
                 if r["run"] == "exclusive" and r["done"] == r["jobs"]), {})
    for r in runs:
        base = base_second if r["history"] else base_first
        r["vs_exclusive"] = round(r["makespan_s"] / base, 3) if base and r["makespan_s"] else None
        if r["policy"] == "auto":
            target = 0.40 if r["history"] else 0.45
            goals.append({"run": r["run"], "target": target, "ratio": r["vs_exclusive"],
                          "met": r["vs_exclusive"] is not None and r["vs_exclusive"] <= target})
        again = r.get("again")
        if again is not None:  # the returning user's jobs, against their exclusive run times
            names = [j["name"] for j in trace["jobs"][:RESUBMIT]]
            base_again = sum(solo[n] for n in names if solo.get(n)) if all(solo.get(n) for n in names) else None
            again["exclusive_s"] = round(base_again, 1) if base_again else None
            again["vs_exclusive"] = round(again["makespan_s"] / base_again, 3) if base_again and again["makespan_s"] else None
            goals.append({"run": f"{r['run']} (resubmitted, new output paths)", "target": 0.40,
                          "ratio": again["vs_exclusive"],
                          "met": again["vs_exclusive"] is not None and again["vs_exclusive"] <= 0.40})
    doc = {"environment": env, "trace": trace, "runs": runs, "simulator": sims, "goals": goals, "notes": notes}
    (out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = ["# First run on a real GPU: jobs without history, then a returning user (issues 16, 29)", "",
             f"- device: {env.get('device_name')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, "
             f"torch {env.get('torch')}, {env.get('time_utc')}", f"- {len(trace['jobs'])} jobs, "
             f"~{trace['train_s']:g} s of training each alone; `benchmarks/gpu/first_run_gpu.py`"]
    lines += [f"- **{env['note']}**"] if env.get("note") else []
    lines += ["", "| run | makespan (s) | vs exclusive | mean JCT (s) | most at once | done | OOM crashes "
              "| recovered | timed out |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        lines.append(f"| {r['run']} ({r.get('resolved_sharing', r['sharing'])}) | {r['makespan_s']} | {r['vs_exclusive']} | "
                     f"{r['mean_jct_s']} | {r['most_at_once']} | {r['done']}/{r['jobs']} | {r['oom_crashes']} | "
                     f"{r['oom_recovered']}/{r['oom_jobs']} | {r['timed_out']} |")
        if (a := r.get("again")) is not None:
            lines.append(f"| {r['run']}: {a['jobs']} resubmitted | {a['makespan_s']} | {a.get('vs_exclusive')} | "
                         f"{a['mean_jct_s']} | | {a['done']}/{a['jobs']} | {a['oom_crashes']} | "
                         f"{a['oom_recovered']}/{a['oom_jobs']} | {a['timed_out']} |")
    lines += ["", "Goals: " + ("; ".join(f"{g['run']} {g['ratio']} <= {g['target']}: "
                                         f"{'met' if g['met'] else 'NOT met'}" for g in goals) or "none run")]
    if sims:
        lines += ["", "| run | simulator makespan (s) | real | simulator mean JCT (s) | real |", "|---|---:|---:|---:|---:|"]
        real = {r["run"]: r for r in runs}
        lines += [f"| {s['run']} | {s['makespan_s']} | {real[s['run']]['makespan_s']} | {s['mean_jct_s']} | "
                  f"{real[s['run']]['mean_jct_s']} |" for s in sims]
    lines += ["", "| job | declared | estimate (MiB) | highest peak (MiB) | peak/estimate | steps | solo step (ms) |",
              "|---|---|---:|---:|---:|---:|---:|"]
    peaks: dict[str, float] = {}  # the highest of all runs (attempts that crashed included)
    for j in (j for r in runs for j in r["per_job"] if j["peak_mib"]):
        peaks[j["name"]] = max(peaks.get(j["name"], 0.0), j["peak_mib"])
    for j in trace["jobs"]:
        p = peaks.get(j["name"])
        lines.append(f"| {j['name']} | {j['declared']} | {j['estimate_mib']} | {p or 'n/a'} | "
                     f"{round(p / j['estimate_mib'], 2) if p and j['estimate_mib'] else 'n/a'} | {j['steps']} | "
                     f"{j['solo_step_s'] * 1000:.1f} |")
    lines += [""] + [f"- {n}" for n in notes]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- main


def expected_s(name: str, trace: dict, runs: list[dict]) -> float:
    """A run's expected length, for the budget. Exclusive: about the sum of solo lengths. A
    collocated run: half the exclusive makespan (measured if there is one; the goal is 0.45),
    so a run that cannot meet its goal in the time left is not started."""
    solo = sum(j["steps"] * j["solo_step_s"] + STARTUP_S for j in trace["jobs"])
    if RUNS[name][0] == "exclusive":
        return 20 + 1.05 * solo
    measured = next((r["makespan_s"] for r in runs if r["run"] == "exclusive" and r["makespan_s"]), None)
    resubmit = RESUBMIT / len(trace["jobs"]) if RUNS[name][1] == "auto" else 0.0
    return 20 + 0.5 * (1.0 + resubmit) * (measured or solo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", default="exclusive,auto",
                        help=f"in this order, from: {', '.join(RUNS)}")
    parser.add_argument("--from", dest="source", type=Path, help="an earlier call's --out: its trace.json "
                        "(same commands, no new estimates) and history.sqlite")
    parser.add_argument("--budget-s", type=float, default=540.0, help="skip runs that would end after this")
    parser.add_argument("--train-s", type=float, default=6.0, help="seconds of training per job alone")
    parser.add_argument("--snapshot-s", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="12 jobs of 5 s training")
    parser.add_argument("--dry-run", action="store_true", help="CPU: emulated H100, 3 tiny jobs")
    parser.add_argument("--job-python", default="python3", help="the jobs' interpreter, as a user types it "
                        "(found on PATH; a path of this machine would change the command's signature elsewhere)")
    parser.add_argument("--param", action="append", default=[], help="passed to every collocating daemon")
    args = parser.parse_args(argv)
    t_start = time.monotonic()
    runs_wanted = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs_wanted if r not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {unknown}; known: {', '.join(RUNS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    WORKDIR.mkdir(exist_ok=True)
    shutil.copy(JOB_SCRIPT, WORKDIR / "first_run_job.py")
    gpus = "emulated:1xH100-80GB" if args.dry_run else "nvml"
    notes: list[str] = []
    if args.source:
        trace = json.loads((args.source / "trace.json").read_text())
        (args.out / "trace.json").write_text(json.dumps(trace, indent=1) + "\n")
        runs = json.loads((args.source / "summary.json").read_text())["runs"] if (args.source / "summary.json").exists() else []
        history = args.source / "history.sqlite"
        notes.append(f"trace, estimates and history from {args.source.name}; its runs are repeated in this summary")
    else:
        gpu_type = "H100-80GB" if args.dry_run else gpu_type_here()
        trace = prepare(args.out, dry=args.dry_run, quick=args.quick, train_s=5.0 if args.quick else args.train_s,
                        gpu_type=gpu_type, job_python=args.job_python)
        runs, history = [], args.out / "history.sqlite"
    for name in runs_wanted:
        with_history = RUNS[name][2]
        if with_history and not history.exists():
            notes.append(f"{name} skipped: no history.sqlite (run `exclusive` first, or pass --from)")
            continue
        left = args.budget_s - (time.monotonic() - t_start)
        need = expected_s(name, trace, runs) if not args.dry_run else 0.0
        if need > left:
            notes.append(f"{name} skipped: expected ~{need:.0f} s, {left:.0f} s left of the budget")
            continue
        settle = args.param if RUNS[name][0] != "exclusive" else []
        timeout = max(30.0, left - 15) if not args.dry_run else 120.0
        runs.append(run_one(name, trace, args.out, gpus=gpus, dry=args.dry_run, history=history if with_history else None,
                            timeout_s=timeout, snapshot_s=args.snapshot_s, settle=settle))
        r = runs[-1]
        log(f"{name}: makespan {r['makespan_s']} s, {r['done']}/{r['jobs']} done, most at once {r['most_at_once']}, "
            f"OOM {r['oom_crashes']} ({r['oom_recovered']}/{r['oom_jobs']} recovered)")
    sims, note = simulate(runs, trace["gpu_type"])
    notes.append(note)
    report(args.out, environment(args.dry_run), trace, runs, sims, notes)
    print((args.out / "summary.md").read_text())
    return 0


def gpu_type_here() -> str:
    from collocate.core.gputypes import type_name_from_product
    from collocate.gpus.nvml import driver_versions

    return type_name_from_product(str(driver_versions(0).get("device_name") or "H100-80GB"))


if __name__ == "__main__":
    sys.exit(main())
