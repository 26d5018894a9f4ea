"""Daemon load: 1,000 submissions from 10 concurrent clients, and idle CPU with 8 emulated GPUs.

    python benchmarks/daemon_load.py [--submissions 1000] [--clients 10] [--idle-seconds 60]

Submission: a real ``collocate serve`` on ``emulated:8xA100-40GB`` (drained, so the measurement
is the submit path: validation, SQLite write, queue insert, reply), 10 threads each with its own
connections submitting concurrently; checks every submission got a distinct id and the daemon
lists exactly that many jobs (none lost or duplicated). Idle: a fresh daemon with 8 emulated
GPUs at a 1 s sampling period and no jobs; its CPU time (user+sys, psutil) over the window.

Writes benchmarks/results/daemon_load-<date>.json and .md. Goal (issue #3): idle under 1 % of
one core at a 1 s period.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

from collocate.client.connect import Client, list_jobs

GPUS = "emulated:8xA100-40GB"


def start_daemon(state_dir: Path, period: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(state_dir), "--gpus", GPUS,
         "--period", str(period)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return wait_until_serving(proc, state_dir, timeout_s=60)


def wait_until_serving(proc: subprocess.Popen, state_dir: Path, timeout_s: float) -> subprocess.Popen:
    """``proc`` once its daemon answers a ping; exits the benchmark if it dies or never answers."""
    client = Client(state_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited with {proc.returncode}; see {state_dir}/daemon.log")
        try:
            client.request("ping")
            return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("daemon did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def bench_submit(root: Path, n: int, clients: int) -> dict:
    state = root / "submit"
    proc = start_daemon(state, 1.0)
    try:
        client = Client(state)
        client.request("drain")
        latencies: list[float] = []
        ids: list[str] = []
        errors: list[str] = []
        lock = threading.Lock()
        env = dict(os.environ)

        def worker(k: int) -> None:
            c = Client(state)
            for i in range(k, n, clients):
                t = time.perf_counter()
                try:
                    r = c.request("submit", argv=["python", "train.py", f"--seed={i}"], cwd=str(root),
                                  mem="2GiB", name=f"bench-{i}", base_env=env)
                except Exception as exc:
                    with lock:
                        errors.append(str(exc))
                    continue
                dt = time.perf_counter() - t
                with lock:
                    latencies.append(dt)
                    ids.append(r["id"])

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        listed = list_jobs(client.request, all=True)
        lat = sorted(latencies)
        return {
            "submissions": n, "clients": clients, "accepted": len(ids), "errors": len(errors),
            "distinct_ids": len(set(ids)), "listed_by_daemon": len(listed),
            "listed_distinct_names": len({r["name"] for r in listed}),
            "latency_ms_median": 1000 * statistics.median(lat),
            "latency_ms_p99": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "throughput_per_s": len(ids) / wall, "wall_s": wall,
        }
    finally:
        stop(proc)


def bench_idle(root: Path, seconds: float, period: float) -> dict:
    proc = start_daemon(root / "idle", period)
    try:
        p = psutil.Process(proc.pid)
        time.sleep(3.0)  # let start-up work finish
        c0, t0 = p.cpu_times(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = p.cpu_times(), time.monotonic()
        used = (c1.user - c0.user) + (c1.system - c0.system)
        return {"gpus": 8, "period_s": period, "window_s": t1 - t0,
                "cpu_percent_of_one_core": 100 * used / (t1 - t0)}
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--submissions", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="collocate-bench-") as tmp:
        root = Path(tmp)
        result = {"machine": machine(), "submit": bench_submit(root, ns.submissions, ns.clients),
                  "idle": bench_idle(root, ns.idle_seconds, 1.0)}
    out = Path(__file__).parent / "results" / f"daemon_load-{result['machine']['date']}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    s, i, m = result["submit"], result["idle"], result["machine"]
    md = (
        f"# Daemon load ({m['date']}, {m['host_cpu']}, {m['cores']} cores, Python {m['python']}, no GPU)\n\n"
        f"Submissions: {s['submissions']} from {s['clients']} concurrent clients: {s['accepted']} accepted, "
        f"{s['errors']} errors, {s['distinct_ids']} distinct ids, daemon lists {s['listed_by_daemon']} "
        f"({s['listed_distinct_names']} distinct).\n\n"
        f"| metric | value |\n| --- | --- |\n"
        f"| submit latency median | {s['latency_ms_median']:.1f} ms |\n"
        f"| submit latency p99 | {s['latency_ms_p99']:.1f} ms |\n"
        f"| throughput | {s['throughput_per_s']:.0f} submissions/s |\n"
        f"| idle CPU, 8 emulated GPUs, {i['period_s']:.0f} s period | {i['cpu_percent_of_one_core']:.2f} % of one core "
        f"(over {i['window_s']:.0f} s) |\n\n"
        "The daemon was drained during the submission run, so the numbers are the submit path "
        "(validation, two SQLite commits, queue insert, reply) and not job launches. The machine "
        "was shared with other work (2 cores, load average 6-8), so latencies are upper bounds.\n"
    )
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
