"""Never worse than a plain queue: issue 35's goals, measured on emulated GPUs with real daemons.

Two fresh daemons run side by side in one run on ``emulated:4xA100-40GB`` (40 GB GPUs, period
1 s): ``exclusive`` (the plain queue: one job per GPU) and the defaults (``--policy auto``,
``--sharing auto``). One submitter gives both the same seeded mix at the same moments
(``make_mix``): 54 one-GPU emulated training jobs (``plain_queue_job.py``: start-up with no GPU
use, a memory ramp, first steps, steady activity, steps reported with ``log_metric``), of which

* ``under``: up to a third overrun their declaration: declare 2-4 GiB, need 3-10x that (up to
  30 GiB), the growth late (``--peak-mem`` at 50-80 % of progress);
* ``late``: declare what they will need, but hold half of it until 50-80 % of progress;
* ``no-mem``: submitted without ``--mem``;
* ``honest``: declare their peak x1.02, as an estimate would;

and 4 CPU jobs (``--gpus 0``, ``sleep``), and a probe ``sleep 1`` with ``--mem 1GiB`` submitted
once the GPUs are busy. Arrivals are spread over the first minute (scaled).

It reports per daemon: every job's end state; out-of-memory crashes split by whether the job was
within its commitment (its real need at most the memory the attempt was placed with: a crash
then is a neighbour's fault) or had overrun it; the time from submission to start of the jobs
that fitted a GPU's room at submission (``collocate gpus``, ``gpu_room``); when the probe ended
and what the GPUs read then; how soon the CPU jobs started; makespan; and job by job against ``exclusive``
(``collocate.sim.metrics.versus_exclusive``: each job's completion time over its exclusive
one, p50, p95, max, jobs worse off); then the goals of issue 35 as pass/fail. Under ``auto`` it
also says why each fitted job waited (``WaitTrace``: the daemon's own wait reason for it, read
every half second, a ``slowdown`` wait split by whether a GPU with room for it read under 60 %
SM then, i.e. whether only the start-up/observe slot kept it off; the rest of its wait, not
seen pending, is the time to the round that placed it), and, for both daemons, the time from
placing each job to its process being created (``spawn_times``).

A job *fits* a GPU's room when its real need fits both the memory the GPU measures free and the
memory its jobs have not committed (a running job commits its requirement before it has
allocated it: a newcomer in what it has not yet ramped into would crash within its commitment),
on a GPU whose SM activity lately (``sm_recent``, a few samples) reads below 60 % (``ROOM_SM``:
issue 35's probe beside GPUs at <= 60 % SM, and ``auto``'s ``observe_below_sm``): a GPU that
reads busier has memory, not room, and a job started there slows its jobs. The goal is on this
definition; the jobs whose memory alone fitted are reported beside it. Until 2026-11-29 a job
counted as fitted when its need fitted the largest measured free memory of any GPU, whatever
was committed there or how busy it read. A job that fits may still wait for jobs submitted
before it that fit too (the queue is first come, first served).

Run: ``python benchmarks/plain_queue.py`` (about 5-8 minutes on a 2-core machine) or
``--quick`` (16 jobs, half durations, for a test), ``--param NAME=VALUE`` to give the auto daemon a
policy parameter (``serve --param``: a variant against the same exclusive run); results go to
``benchmarks/results/plain_queue-emulated-<date>[-quick].{json,md}`` (or ``--out PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from collocate.daemon.child import DaemonProcess
from collocate.sim.metrics import WORSE_TOLERANCE, versus_exclusive

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from _machine import machine  # noqa: E402
from first_run import completion_times, wait_done  # noqa: E402

JOB_SCRIPT = ROOT / "plain_queue_job.py"
GPUS = "emulated:4xA100-40GB"
GPU_MIB = 40 * 1024.0
GIB = 1024.0
RUNS = {"exclusive": ["--policy", "exclusive", "--sharing", "time-slicing"], "auto": []}  # auto: defaults
START_S = 5.0  # a job that fits a GPU's measured room starts within this (issue 35)
PROBE_S = 10.0  # the probe ends within this
ROOM_SM = 0.6  # a GPU reading less SM than this lately has room for load (issue 35's probe: <= 60%)
CPU_START_S = 2.0  # a CPU job starts "at once": within two rounds of the daemon's 1 s period
TRACE_S = 0.5  # how often the wait trace reads the auto daemon's queue
WITHIN = 1.02  # a need within 2 % of what the attempt was placed with counts as within it


@dataclass(frozen=True)
class MixJob:
    name: str
    kind: str  # honest, late, under, no-mem, cpu, probe
    arrival_s: float
    seconds: float
    mem_mib: float  # held after the ramp (0: a CPU job)
    declared_mib: float | None  # what it is submitted with (--mem); None: none given
    peak_mib: float | None = None  # grows to this at ``peak_at`` of its progress
    peak_at: float = 0.5
    sm: float = 0.5
    dram: float = 0.2
    startup_s: float = 0.0
    warmup_s: float = 0.0
    ramp_s: float = 2.0

    @property
    def gpus(self) -> int:
        return 0 if self.kind == "cpu" else 1

    @property
    def need_mib(self) -> float:
        """The most GPU memory it really takes."""
        return max(self.mem_mib, self.peak_mib or 0.0)

    @property
    def overruns(self) -> bool:
        return self.declared_mib is not None and self.need_mib > self.declared_mib * WITHIN

    def argv(self) -> list[str]:
        if self.kind in ("cpu", "probe"):
            return ["sleep", f"{self.seconds:g}"]
        argv = [sys.executable, str(JOB_SCRIPT), "--name", self.name, "--mem-mib", f"{self.mem_mib:.0f}",
                "--seconds", f"{self.seconds:.2f}", "--sm", f"{self.sm:.2f}", "--dram", f"{self.dram:.2f}",
                "--startup", f"{self.startup_s:.2f}", "--warmup", f"{self.warmup_s:.2f}",
                "--ramp", f"{self.ramp_s:.2f}"]
        if self.peak_mib is not None:
            argv += ["--peak-mib", f"{self.peak_mib:.0f}", "--peak-at", f"{self.peak_at:.2f}"]
        return argv


def make_mix(n: int = 54, cpu: int = 4, scale: float = 1.0, seed: int = 35) -> list[MixJob]:
    """The seeded mix (module docstring), in arrival order; ``scale`` multiplies every time."""
    rng = random.Random(seed)
    kinds = ["under"] * (n // 3 - 2) + ["late"] * (n // 6) + ["no-mem"] * (n // 6)
    kinds += ["honest"] * (n - len(kinds))
    rng.shuffle(kinds)
    window = 60.0 * scale
    arrivals = sorted(rng.uniform(0.0, window) for _ in range(n))
    jobs = []
    for i, (kind, arrival) in enumerate(zip(kinds, arrivals, strict=True)):
        sm = rng.uniform(0.15, 0.8)
        common = dict(arrival_s=round(arrival, 2), seconds=round(rng.uniform(10.0, 22.0) * scale, 2),
                      sm=round(sm, 2), dram=round(sm * rng.uniform(0.3, 0.6), 2),
                      startup_s=round(rng.uniform(2.0, 4.0) * scale, 2),
                      warmup_s=round(rng.uniform(1.0, 2.0) * scale, 2), ramp_s=round(2.0 * scale, 2),
                      peak_at=round(rng.uniform(0.5, 0.8), 2))
        if kind == "under":  # declares 2-4 GiB, needs 3-10x that, up to 30 GiB, late
            declared = rng.uniform(2.0, 4.0) * GIB
            peak = min(30.0 * GIB, declared * rng.uniform(3.0, 10.0))
            job = MixJob(f"j{i:02d}-{kind}", kind, mem_mib=declared * rng.uniform(0.7, 1.0),
                         declared_mib=declared, peak_mib=peak, **common)
        elif kind == "late":  # declares its need, holds half of it until late
            declared = rng.uniform(4.0, 14.0) * GIB
            job = MixJob(f"j{i:02d}-{kind}", kind, mem_mib=declared * rng.uniform(0.4, 0.6),
                         declared_mib=declared, peak_mib=declared * rng.uniform(0.9, 1.0), **common)
        elif kind == "no-mem":
            job = MixJob(f"j{i:02d}-{kind}", kind, mem_mib=rng.uniform(2.0, 12.0) * GIB, declared_mib=None,
                         **common)
        else:
            need = rng.uniform(2.0, 14.0) * GIB
            job = MixJob(f"j{i:02d}-{kind}", kind, mem_mib=need, declared_mib=need * 1.02, **common)
        jobs.append(job)
    for k in range(cpu):  # a pipeline's CPU steps, through the same queue
        at = round(window * (k + 1) / (cpu + 1), 2)
        jobs.append(MixJob(f"cpu{k}", "cpu", at, round(3.0 * scale, 2), 0.0, None))
    jobs.append(MixJob("probe", "probe", round(window * 0.5, 2), 1.0, 0.0, GIB))  # GPUs busy by then
    return sorted(jobs, key=lambda j: (j.arrival_s, j.name))


def gpu_room(daemon: DaemonProcess) -> list[tuple[float, float]]:
    return gpu_room_of(daemon.client.request("gpus"))


def gpu_room_of(rows: list[dict]) -> list[tuple[float, float]]:
    """Each GPU's room now (``collocate gpus``): the memory it can give, measured free and not
    committed to its jobs (a job commits its requirement from placement on, before it has
    allocated it) nor held by processes that are no job's, whichever is less; and the SM it
    reads lately (``sm_recent``)."""
    return [(min(r["free_mib"], r["total_mib"] - r["committed_mib"] - r["other_mib"]), r["sm_recent"])
            for r in rows if r.get("free_mib") is not None]


def fits(need_mib: float, room: list[tuple[float, float]], *, load: bool) -> bool:
    """Whether a GPU had room for ``need_mib``, and (``load``) read less than ``ROOM_SM``."""
    return any(mib >= need_mib and (not load or sm < ROOM_SM) for mib, sm in room)


def submit_side_by_side(daemons: dict[str, DaemonProcess], mix: list[MixJob], work: Path,
                        trace: WaitTrace) -> tuple[dict, dict]:
    """Submit ``mix`` to every daemon at its arrival times: per daemon, name -> id and name ->
    each GPU's room when it was submitted (``gpu_room``)."""
    ids: dict[str, dict[str, str]] = {run: {} for run in daemons}
    room: dict[str, dict[str, list]] = {run: {} for run in daemons}
    t0 = time.monotonic()
    for job in mix:
        time.sleep(max(0.0, t0 + job.arrival_s - time.monotonic()))
        for run, daemon in daemons.items():
            room[run][job.name] = gpu_room(daemon)
            reply = daemon.client.request(
                "submit", argv=job.argv(), gpus=job.gpus, name=job.name, cwd=str(work),
                mem=None if job.declared_mib is None else f"{job.declared_mib:.0f}MiB",
                base_env=dict(os.environ))
            ids[run][job.name] = reply["id"]
            if run == "auto":
                trace.need[reply["id"]] = job.need_mib
    return ids, room


class WaitTrace(threading.Thread):
    """Why each pending job waits, as the daemon says (``ls``: its wait kind and reason), read
    every ``TRACE_S`` while the mix runs: the breakdown of a fitted job's submit-to-start time."""

    def __init__(self, daemon: DaemonProcess) -> None:
        super().__init__(daemon=True)
        self.client = daemon.client
        self.seen: dict[str, list[tuple]] = {}  # job id -> (time, wait kind, reason, gpu_room)
        self.done = threading.Event()
        self.need: dict[str, float] = {}  # job id -> its real need (set as jobs are submitted)

    def run(self) -> None:
        while not self.done.is_set():
            now = time.time()
            try:
                rows = self.client.request("ls")
            except Exception:  # the daemon is stopping
                return
            try:
                room = gpu_room_of(self.client.request("gpus"))
            except Exception:
                return
            for r in rows:
                if r["state"] == "pending" and r.get("wait"):
                    self.seen.setdefault(r["id"], []).append((now, r["wait"], r.get("reason") or "", room))
            self.done.wait(TRACE_S)

    def breakdown(self, detail: dict) -> dict:
        """A job's wait split: seconds seen waiting per wait kind (each sample counts until the
        job's next sample, the last until its start: under load the trace reads less often than
        every ``TRACE_S``), the first reason of each kind, and the rest of the wait (from its
        submission to its first sample, or, never seen waiting, to the round that placed it)."""
        samples = self.seen.get(detail["id"], [])
        start = detail["attempts"][0]["start"] if detail["attempts"] else None
        kinds: dict[str, float] = {}
        reasons: dict[str, str] = {}
        need = self.need.get(detail["id"], 0.0)
        for (t, kind, reason, room), nxt in zip(samples, [*samples[1:], None][:len(samples)], strict=True):
            if kind == "slowdown":  # gain gate: a GPU with its room read < ROOM_SM, yet no slot there
                kind = "slowdown, room < 60% SM" if fits(need, room, load=True) else "slowdown, GPUs busy"
            until = nxt[0] if nxt else (start or t + TRACE_S)  # pending at both: this wait until the next
            kinds[kind] = kinds.get(kind, 0.0) + max(0.0, until - t)
            reasons.setdefault(kind, reason)
        wait = None if start is None else start - detail["submit_time"]
        return {"wait_s": None if wait is None else round(wait, 2),
                "by_kind_s": {k: round(v, 2) for k, v in kinds.items()}, "reasons": reasons,
                "first_seen_waiting_s": round(samples[0][0] - detail["submit_time"], 2) if samples else None,
                "samples": [(round(t - detail["submit_time"], 2), k) for t, k, _, _ in samples],
                "unseen_s": None if wait is None else round(max(0.0, wait - sum(kinds.values())), 2)}


def ooms(details: dict, mix: dict[str, MixJob]) -> dict:
    """Out-of-memory attempts, split: the job within what the attempt was placed with (a
    neighbour's overrun crashed it) or beyond it (its own)."""
    within, overran = [], []
    for name, d in details.items():
        for a in d["attempts"]:
            if a["outcome"] != "oom":
                continue
            placed = a["mem_mib"]
            fits = placed is not None and mix[name].need_mib <= placed * WITHIN
            (within if fits else overran).append(f"{name}#{a['n']}")
    return {"within_commitment": within, "overran": overran}


def waits(trace: WaitTrace, details: dict, room: dict[str, list], mix: dict[str, MixJob]) -> dict:
    """The fitted jobs' submit-to-start waits, split (``WaitTrace.breakdown``), and over them: the
    seconds spent per wait kind and how many jobs waited on each."""
    fit = [n for n, j in mix.items() if j.gpus and j.kind != "probe" and fits(j.need_mib, room[n], load=True)]
    jobs = {n: trace.breakdown(details[n]) for n in [*fit, "probe"]}
    kinds: dict[str, list[float]] = {}
    for n in fit:
        for k, v in jobs[n]["by_kind_s"].items():
            kinds.setdefault(k, []).append(v)
    return {"jobs": jobs, "by_kind": {k: {"jobs": len(v), "total_s": round(sum(v), 1), **quantiles(v)}
                                      for k, v in kinds.items()},
            "unseen_s": quantiles([jobs[n]["unseen_s"] for n in fit if jobs[n]["unseen_s"] is not None])}


def spawn_times(state_dir: Path, details: dict) -> dict:
    """From the round that placed each job's first attempt (its recorded start) to its process
    being created (the runner's ``child.json``, after its cgroups, MPS and environment): the part
    of a wait that is neither the queue nor the policy."""
    gaps = []
    for d in details.values():
        if d["attempts"]:
            record = state_dir / "jobs" / d["id"] / "attempt-1" / "child.json"
            if record.is_file():
                gaps.append(json.loads(record.read_text())["started"] - d["attempts"][0]["start"])
    return quantiles(gaps)


def quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    v = np.array(values)
    return {"n": len(values), "p50": round(float(np.percentile(v, 50)), 2),
            "p95": round(float(np.percentile(v, 95)), 2), "max": round(float(v.max()), 2)}


def most_at_once(details: dict) -> int:
    """The most attempts that ran at one moment, from their start and end times (whatever
    the polling saw)."""
    edges = sorted((t, step) for d in details.values() for a in d["attempts"] if a["end"]
                   for t, step in ((a["start"], 1), (a["end"], -1)))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def measure(details: dict, room: dict[str, list], mix: dict[str, MixJob]) -> dict:
    first = min(d["submit_time"] for d in details.values())
    ends = [d["end_time"] for d in details.values() if d["end_time"]]
    starts = {n: d["attempts"][0]["start"] - d["submit_time"] for n, d in details.items() if d["attempts"]}
    gpu_jobs = [n for n, j in mix.items() if j.gpus and j.kind != "probe"]
    fit_memory = [n for n in gpu_jobs if fits(mix[n].need_mib, room[n], load=False)]
    fit = [n for n in gpu_jobs if fits(mix[n].need_mib, room[n], load=True)]
    late_fits = sorted((n for n in fit if starts.get(n, float("inf")) > START_S),
                       key=lambda n: -starts.get(n, float("inf")))
    probe = details["probe"]
    cpu = [n for n, j in mix.items() if j.kind == "cpu"]
    return {
        "states": {n: d["state"] for n, d in details.items()},
        "not_done": {n: f"{d['state']}: {d.get('reason') or ''}"[:200] for n, d in details.items()
                     if d["state"] != "done"},
        "oom": ooms(details, mix),
        "makespan_s": round(max(ends) - first, 1) if ends else None,
        "most_at_once": most_at_once(details),
        "start_if_fits_memory_s": quantiles([starts[n] for n in fit_memory if n in starts]),
        "fits_memory_started_late": sum(starts.get(n, float("inf")) > START_S for n in fit_memory),
        "start_if_fits_s": quantiles([starts[n] for n in fit if n in starts]),
        "fits_started_late": {n: round(starts[n], 1) if n in starts else None for n in late_fits},
        "probe_end_s": round(probe["end_time"] - probe["submit_time"], 1) if probe["end_time"] else None,
        "probe_beside_sm": sorted(round(sm, 2) for _, sm in room["probe"]),  # lately, at its submission
        "cpu_start_s": quantiles([starts[n] for n in cpu if n in starts]),
        "completion_s": completion_times(details),
    }


def goals(results: dict) -> list[tuple[str, bool, str]]:
    """Issue 35's goals as (goal, met, what was measured)."""
    ex, auto = results["exclusive"], results["auto"]
    v = auto["versus_exclusive"]
    throughput = auto["makespan_s"] / ex["makespan_s"] if ex["makespan_s"] and auto["makespan_s"] else float("nan")
    fits = auto["start_if_fits_s"]
    return [
        ("every job completes under exclusive", not ex["not_done"], f"{len(ex['not_done'])} not done"),
        ("every job completes under auto (defaults, default retries)", not auto["not_done"],
         f"{len(auto['not_done'])} not done"),
        ("0 OOM crashes of jobs within their commitment (auto)", not auto["oom"]["within_commitment"],
         f"{len(auto['oom']['within_commitment'])} within, {len(auto['oom']['overran'])} overran"),
        (f"a job that fits a GPU's room (memory measured and committed, SM < {ROOM_SM:.0%}) starts "
         f"within {START_S:g} s (auto)",
         fits["n"] == 0 or fits["max"] <= START_S,
         f"{fits['n']} fitted; max {fits.get('max', '-')} s, {len(auto['fits_started_late'])} later"),
        (f"`sleep 1 --mem 1GiB` beside busy GPUs ends within {PROBE_S:g} s (auto)",
         auto["probe_end_s"] is not None and auto["probe_end_s"] <= PROBE_S,
         f"{auto['probe_end_s']} s; GPUs read {', '.join(f'{x:.0%}' for x in auto['probe_beside_sm'])} SM lately"),
        (f"a `--gpus 0` job starts at once (within {CPU_START_S:g} s, auto)",
         auto["cpu_start_s"].get("max", float("inf")) <= CPU_START_S, f"max {auto['cpu_start_s'].get('max')} s"),
        ("job by job: p95 of completion over exclusive <= 1.0, max <= 2.0 (auto)",
         v["p95"] <= 1.0 and v["max"] <= 2.0,
         f"p50 {v['p50']}, p95 {v['p95']}, max {v['max']}, {v['worse']} worse"),
        ("throughput: makespan no worse than exclusive (auto)", throughput <= 1.0, f"{throughput:.2f}x exclusive"),
    ]


def run(n: int, cpu: int, scale: float, seed: int, root: Path, params: Sequence[str] = ()) -> dict:
    """``params``: ``NAME=VALUE`` policy parameters for the auto daemon (``serve --param``)."""
    mix = make_mix(n, cpu, scale, seed)
    by_name = {j.name: j for j in mix}
    work = root / "work"
    work.mkdir(parents=True)
    daemons = {}
    try:
        for name, args in RUNS.items():
            if name == "auto":
                args = [*args, *(a for p in params for a in ("--param", p))]
            daemons[name] = DaemonProcess(root / name, ["--gpus", GPUS, *args], root / f"{name}.log",
                                          name=f"the {name} daemon")
        for daemon in daemons.values():
            daemon.wait_ready()
        trace = WaitTrace(daemons["auto"])
        trace.start()
        ids, room = submit_side_by_side(daemons, mix, work, trace)
        results, details = {}, {}
        for name, daemon in daemons.items():
            details[name], _ = wait_done(daemon, ids[name])
            results[name] = measure(details[name], room[name], by_name)
        trace.done.set()
        trace.join()
        results["auto"]["waits"] = waits(trace, details["auto"], room["auto"], by_name)
        for name, daemon in daemons.items():
            results[name]["spawn_s"] = spawn_times(daemon.state_dir, details[name])
    finally:
        for daemon in daemons.values():
            daemon.stop(timeout_s=10)
    base = results["exclusive"]["completion_s"]
    for r in results.values():
        r["versus_exclusive"] = versus_exclusive(r["completion_s"], base)[0].as_dict()
    return {"mix": [asdict(j) | {"need_mib": round(j.need_mib), "overruns": j.overruns} for j in mix],
            "results": results}


def report(doc: dict) -> str:
    results, mix = doc["results"], doc["mix"]
    kinds = {k: sum(j["kind"] == k for j in mix) for k in ("honest", "late", "under", "no-mem", "cpu", "probe")}
    m = doc["machine"]
    lines = [f"# Never worse than a plain queue: exclusive and auto side by side ({m['date']})", "",
             f"`python benchmarks/plain_queue.py{doc['command']}`; {m['host_cpu']}, {m['cores']} cores, no GPU; "
             f"{GPUS}, two daemons at once (period 1 s), durations x{doc['scale']:g}, seed {doc['seed']}; "
             f"load average (1 min) {doc['load_average']['start'][0]} at the start, "
             f"{doc['load_average']['end'][0]} at the end; {doc['wall_s']:.0f} s in all. "
             f"Mix: {', '.join(f'{v} {k}' for k, v in kinds.items())}; "
             f"{sum(j['overruns'] for j in mix)} overrun their declaration. A job *fits* a GPU's room when "
             "its need fits memory both measured free and not committed to the GPU's jobs, on a GPU reading "
             f"less than {ROOM_SM:.0%} SM lately (since 2026-11-29; before, any GPU's measured free memory "
             "counted); jobs whose memory alone fitted are shown beside.", "",
             "| | exclusive | auto |", "|---|---:|---:|"]

    def row(label: str, f) -> None:
        lines.append(f"| {label} | {f(results['exclusive'])} | {f(results['auto'])} |")

    row("done / jobs", lambda r: f"{sum(s == 'done' for s in r['states'].values())} / {len(r['states'])}")
    row("makespan", lambda r: f"{r['makespan_s']} s")
    row("most running at once", lambda r: str(r["most_at_once"]))
    row("OOM crashes: within commitment / overran", lambda r: f"{len(r['oom']['within_commitment'])} / "
        f"{len(r['oom']['overran'])}")
    row("start if its memory fitted (measured and committed): n, p50 / p95 / max", lambda r: (
        f"{r['start_if_fits_memory_s']['n']}, {r['start_if_fits_memory_s'].get('p50', '-')} / "
        f"{r['start_if_fits_memory_s'].get('p95', '-')} / {r['start_if_fits_memory_s'].get('max', '-')} s "
        f"({r['fits_memory_started_late']} after {START_S:g} s)"))
    row(f"start if it fitted (memory, and SM < {ROOM_SM:.0%} lately): n, p50 / p95 / max", lambda r: (
        f"{r['start_if_fits_s']['n']}, {r['start_if_fits_s'].get('p50', '-')} / "
        f"{r['start_if_fits_s'].get('p95', '-')} / {r['start_if_fits_s'].get('max', '-')} s"))
    row(f"fitted (memory and SM), started after {START_S:g} s", lambda r: str(len(r["fits_started_late"])))
    row("probe `sleep 1 --mem 1GiB` ended after", lambda r: f"{r['probe_end_s']} s")
    row("placed to its process created: p50 / p95 / max", lambda r: (
        f"{r.get('spawn_s', {}).get('p50', '-')} / {r.get('spawn_s', {}).get('p95', '-')} / "
        f"{r.get('spawn_s', {}).get('max', '-')} s"))
    row("CPU jobs started after (max)", lambda r: f"{r['cpu_start_s'].get('max', '-')} s")
    row("completion / exclusive: p50 / p95 / max", lambda r: (
        f"{r['versus_exclusive']['p50']} / {r['versus_exclusive']['p95']} / {r['versus_exclusive']['max']}"))
    row(f"jobs worse off (> {1 + WORSE_TOLERANCE:g}x, or not done)", lambda r: str(r["versus_exclusive"]["worse"]))
    lines += ["", "| goal (issue 35) | met | measured |", "|---|---|---|"]
    lines += [f"| {g} | {'yes' if ok else 'no'} | {what} |" for g, ok, what in doc["goals"]]
    w = results["auto"].get("waits")
    if w:
        lines += ["", "Why fitted jobs waited under auto (the daemon's own wait reasons, read every "
                  f"{TRACE_S:g} s; *unseen*: submission to its first sample, or to the round that placed it if never seen waiting):", "",
                  "| wait | jobs | total s | p50 / p95 / max s |", "|---|---:|---:|---|"]
        for kind, q in sorted(w["by_kind"].items(), key=lambda kv: -kv[1]["total_s"]):
            lines.append(f"| {kind} | {q['jobs']} | {q['total_s']} | {q['p50']} / {q['p95']} / {q['max']} |")
        u = w["unseen_s"]
        lines.append(f"| unseen (to the first sample or the placing round) | {u['n']} | - | {u.get('p50', '-')} / {u.get('p95', '-')} / "
                     f"{u.get('max', '-')} |")
        late = [(n, j) for n, j in w["jobs"].items() if (j["wait_s"] or 0) > START_S]
        if late:
            lines += ["", "| job waited > 5 s | wait s | by kind s | first reason of its longest wait |",
                      "|---|---:|---|---|"]
            for n, j in sorted(late, key=lambda nj: -(nj[1]["wait_s"] or 0)):
                longest = max(j["by_kind_s"], key=j["by_kind_s"].get) if j["by_kind_s"] else None
                why = j["reasons"].get(longest, "").replace("|", "/")[:160] if longest else ""
                kinds = ", ".join(f"{k} {v}" for k, v in j["by_kind_s"].items())
                lines.append(f"| {n} | {j['wait_s']} | {kinds} | {why} |")
    for name, r in results.items():
        if r["not_done"]:
            lines += ["", f"Not done under {name}: " + "; ".join(f"{n} ({why})" for n, why in r["not_done"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 jobs, 2 CPU jobs, half durations (a test)")
    parser.add_argument("--jobs", type=int, help="GPU jobs in the mix (default 54; 16 with --quick)")
    parser.add_argument("--scale", type=float, help="multiply every duration (default 1; 0.5 with --quick)")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a policy parameter of the auto daemon (`serve --param`, repeatable)")
    parser.add_argument("--out", type=Path, help="write <out>.json and <out>.md instead of benchmarks/results/")
    args = parser.parse_args()
    n = args.jobs or (16 if args.quick else 54)
    scale = args.scale or (0.5 if args.quick else 1.0)
    cpu = 2 if args.quick else 4
    info = machine()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run stops its daemons
    load = [round(x, 1) for x in os.getloadavg()]
    out = args.out or ROOT / "results" / f"plain_queue-emulated-{info['date']}{'-quick' if args.quick else ''}"
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="plain-queue-") as tmp:
        doc = run(n, cpu, scale, args.seed, Path(tmp), args.param)
    command = " ".join(sys.argv[1:])
    doc = {"machine": info, "gpus": GPUS, "scale": scale, "seed": args.seed, "jobs": n, "cpu_jobs": cpu,
           "command": f" {command}" if command else "", "wall_s": round(time.time() - started, 1),
           "load_average": {"start": load, "end": [round(x, 1) for x in os.getloadavg()]}, **doc}
    doc["goals"] = goals(doc["results"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    text = report(doc)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {out.with_suffix('.md')} and .json ({doc['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
