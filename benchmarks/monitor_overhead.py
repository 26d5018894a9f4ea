"""Benchmark: CPU cost of the daemon's monitoring at 1 s with 8 emulated GPUs and 32 jobs.

Issue #7's target: under 2% of one core. The setup is what the daemon sees: 32 real jobs, each a
process tree of two processes (a root and a child that holds emulated GPU memory, as a training
script's worker would), four per GPU, each job also appending one line of its own metrics per
second. Every period the script does what the daemon's tick does for monitoring:

1. ``backend.sample()`` (the emulated backend: SQLite, claim liveness, energy integration);
2. ``UsageSampler.observe`` (process trees with psutil, attribution, metric files);
3. ``MonitorStore.write`` (one transaction) and ``PrometheusSink.write``.

CPU time of each part is measured with ``time.process_time`` (this process only; the jobs'
own appends are outside the measured parts). Reported: mean ms per tick per part and the total
as percent of one core (CPU seconds / wall seconds x 100).

    python benchmarks/monitor_overhead.py [--gpus 8] [--jobs 32] [--seconds 25] [--period 1]
    python benchmarks/monitor_overhead.py --mlflow         # also the MLflow sink, reported apart
    python benchmarks/monitor_overhead.py --backend nvml   # real GPUs, real processes you run

Writes benchmarks/results/monitor_overhead-<backend>-<UTC date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine

from collocate.gpus.emulated import EmulatedBackend
from collocate.gpus.emulated_state import process_start_time
from collocate.monitor.job_metrics import log_metric
from collocate.monitor.sampler import UsageJob, UsageSampler
from collocate.monitor.sinks.prometheus import PrometheusSink
from collocate.monitor.store import MonitorStore

PARTS = ("backend_sample", "sampler_observe", "store_write", "prometheus_write")
MLFLOW = "mlflow_write"  # measured apart, with --mlflow: an optional sink, not the sampling


def start_jobs(backend: EmulatedBackend, n_jobs: int, n_gpus: int, workdir: Path
               ) -> tuple[list[subprocess.Popen], list[int], dict[str, UsageJob]]:
    procs, children, refs = [], [], {}
    for i in range(n_jobs):
        # root: sh running a child sleep that holds the GPU memory, like a DataLoader worker tree
        proc = subprocess.Popen(["sh", "-c", "sleep 900 & echo $!; wait"],
                                stdout=subprocess.PIPE, text=True)
        child = int(proc.stdout.readline())
        children.append(child)
        started = process_start_time(child)
        uuid = backend.devices()[i % n_gpus].uuid
        refusal = backend.store.claim(uuid, child, started, 4000 + 100 * i, 0.1 + 0.2 * (i % 4),
                                      0.1)
        if refusal is not None:
            raise SystemExit(f"claim refused: {refusal}")
        procs.append(proc)
        refs[str(i + 1)] = UsageJob(proc.pid, user=f"user{i % 3}", name=f"job{i + 1}",
                                  metrics_file=workdir / f"m{i + 1}.jsonl")
    return procs, children, refs


def run(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="collocate-monbench-"))
    procs: list[subprocess.Popen] = []
    children: list[int] = []
    if args.backend == "emulated":
        backend = EmulatedBackend.create(workdir / "emu", f"{args.gpus}xA100-40GB",
                                         node=socket.gethostname())
        procs, children, refs = start_jobs(backend, args.jobs, args.gpus, workdir)
    else:
        from collocate.gpus.nvml import NvmlBackend

        backend = NvmlBackend(node=socket.gethostname())
        refs = {}
    sampler = UsageSampler.for_backend(backend)
    store = MonitorStore(workdir / "monitor.sqlite")
    prom = PrometheusSink()
    mlflow_sink = None
    mlflow_setup_s = 0.0
    if args.mlflow:
        from collocate.monitor.sinks.base import JobInfo
        from collocate.monitor.sinks.mlflow_sink import MlflowSink, default_tracking_uri

        mlflow_sink = MlflowSink(default_tracking_uri(workdir))
        setup0 = time.perf_counter()  # one-time: create the database and a run per job
        for job_id, ref in refs.items():
            mlflow_sink.job_started(JobInfo(job_id, ref.name, ref.user))
        mlflow_setup_s = time.perf_counter() - setup0
    cpu: dict[str, list[float]] = {p: [] for p in (*PARTS, MLFLOW)}
    mlflow_wall: list[float] = []
    ticks = 0
    load_before = os.getloadavg()[0]
    try:
        wall0, cpu0 = time.monotonic(), time.process_time()
        next_tick = wall0
        while time.monotonic() - wall0 < args.seconds:
            for ref in refs.values():  # the jobs' own logging (not measured)
                log_metric("loss", 1.0 / (ticks + 1), step=ticks, path=str(ref.metrics_file))
            t0 = time.process_time()
            samples = backend.sample()
            t1 = time.process_time()
            tick = sampler.observe(samples, refs)
            t2 = time.process_time()
            store.write(tick)
            t3 = time.process_time()
            prom.write(tick)
            t4 = time.process_time()
            for part, value in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                cpu[part].append(value)
            if mlflow_sink is not None:
                w0, c0 = time.perf_counter(), time.process_time()
                mlflow_sink.write(tick)
                cpu[MLFLOW].append(time.process_time() - c0)
                mlflow_wall.append(time.perf_counter() - w0)
            ticks += 1
            next_tick += args.period
            time.sleep(max(0.0, next_tick - time.monotonic()))
        wall = time.monotonic() - wall0
        whole = time.process_time() - cpu0
        jobs_seen = len(tick.jobs)
        energy = sum(g.energy_j or 0 for g in tick.gpus)
        attributed = sum(j.energy_j or 0 for j in tick.jobs) + sum(
            g.idle_energy_j + g.other_energy_j for g in tick.gpus)
    finally:
        for pid in children:  # the sleeps this script started, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.kill()
            p.wait()
        store.close()
    measured = sum(sum(cpu[p]) for p in PARTS)
    mlflow = cpu.pop(MLFLOW)
    return {
        "benchmark": "monitor_overhead", **machine(), "backend": args.backend,
        "gpus": len(backend.devices()), "jobs": len(refs), "processes_per_job": 2,
        "period_s": args.period, "wall_s": round(wall, 2), "ticks": ticks,
        "ms_per_tick": {p: round(1000 * statistics.mean(v), 3) for p, v in cpu.items()},
        "ms_per_tick_p95": {p: round(1000 * sorted(v)[int(0.95 * (len(v) - 1))], 3)
                            for p, v in cpu.items()},
        "percent_of_one_core": round(100 * measured / wall, 3),
        "percent_of_one_core_monitor_only": round(
            100 * sum(sum(cpu[p]) for p in PARTS[1:]) / wall, 3),
        "percent_of_one_core_whole_process": round(100 * whole / wall, 3),
        "last_tick": {"jobs": jobs_seen, "gpu_energy_j": round(energy, 3),
                      "attributed_j": round(attributed, 3)},
        "target_percent": 2.0,
        "mlflow_sink": None if not mlflow else {
            "percent_of_one_core": round(100 * sum(mlflow) / wall, 3),
            "max_wall_ms_per_tick": round(1000 * max(mlflow_wall), 1),
            "setup_wall_s": round(mlflow_setup_s, 2),
            "flush_every_s": mlflow_sink.flush_every_s,
            "system_every_s": mlflow_sink.system_every_s},
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("emulated", "nvml"), default="emulated")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--period", type=float, default=1.0)
    ap.add_argument("--mlflow", action="store_true",
                    help="also measure the MLflow sink (local SQLite store), reported apart")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"monitor_overhead-{args.backend}-{result['date']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    ms = result["ms_per_tick"]
    stem.with_suffix(".md").write_text(
        f"# Monitoring overhead ({args.backend})\n\n"
        f"{result['date']}, {result['host_cpu']} ({result['cores']} cores), Python "
        f"{result['python']}. {result['gpus']} GPUs, {result['jobs']} running jobs "
        f"(2 processes each), period {args.period} s, {result['ticks']} ticks over "
        f"{result['wall_s']} s. Load average (1 min) before/after: "
        f"{result['load_average_1m']} (a shared machine: other work was running).\n\n"
        "| part | mean ms/tick | p95 ms/tick |\n|---|---|---|\n"
        + "".join(f"| {p} | {ms[p]} | {result['ms_per_tick_p95'][p]} |\n" for p in PARTS)
        + f"\n**{result['percent_of_one_core']}% of one core** for the whole sampling "
        f"(target < 2%); {result['percent_of_one_core_monitor_only']}% without the backend read "
        f"(which the daemon does anyway for scheduling).\n"
        + ("" if result["mlflow_sink"] is None else
           f"\nMLflow sink (local SQLite store; system metrics every "
           f"{result['mlflow_sink']['system_every_s']} s, batches every "
           f"{result['mlflow_sink']['flush_every_s']} s), measured apart: "
           f"{result['mlflow_sink']['percent_of_one_core']}% of one core, longest tick "
           f"{result['mlflow_sink']['max_wall_ms_per_tick']} ms wall (it runs in a worker thread "
           f"in the daemon); one-time setup (database, {result['jobs']} runs) "
           f"{result['mlflow_sink']['setup_wall_s']} s.\n"))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
