"""Benchmark: how long and how much memory `estimate_memory` needs for a ResNet-50 at batch 64.

Issue #4's target: under 5 s on a 2-core CPU machine, estimator memory under 2 GiB. Each
repetition runs in a fresh Python process so that import time and peak RSS are those of a real
`collocate estimate` call; we report the first (cold) estimate's wall time, which includes the
lazy import of ``torch._dynamo`` that ``FakeTensorMode`` triggers, the process's total time
including importing torch, a second (warm) estimate in the same process (what a long-running
service pays), and the process's peak resident set size. The load average is recorded because
other work on the machine inflates the times.

    python benchmarks/estimate_speed.py [--repeats 5] [--entry ...] [--batch-size 64]

Then, side by side in the same run (``--cli-repeats``, 0 to skip), the `collocate estimate`
command as a user types it, cold (``--cold``: everything in the command's process) and answered
by the warm estimator of a daemon started as a user starts it (``collocate serve``, which keeps one
by default; ``estimate/warm.py``), found without options as a member's command finds it:
wall time, CPU time of every process that worked on the answer (the command's, and for the warm
path the forked child's), and the command's peak RSS; the two outputs must be identical.

Writes benchmarks/results/estimate_speed-<UTC date><--tag>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from collocate.estimate.api import estimate_memory
import torch
t1 = time.perf_counter()
est = estimate_memory(sys.argv[1], batch_size=int(sys.argv[2]), gpu=sys.argv[3])
t2 = time.perf_counter()
estimate_memory(sys.argv[1], batch_size=int(sys.argv[2]), gpu=sys.argv[3])
t3 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "estimate_s": t2 - t1, "total_s": t2 - t0, "warm_estimate_s": t3 - t2,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "mib": est.mib, "method": est.method, "torch": torch.__version__,
    "threads": torch.get_num_threads(),
}))
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_cli(argv: list[str], env: dict[str, str]) -> tuple[str, dict[str, float]]:
    """Run one command; its output, wall time, CPU time (user + system) and peak RSS."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    return out.decode(), {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                          "peak_rss_mib": usage.ru_maxrss / 1024}


def children_cpu_s(pid: int) -> float:
    """CPU time of the reaped children of ``pid`` (the warm estimator's forks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def warm_estimator_pid(serve_pid: int) -> int | None:
    """The pid of the warm estimator a daemon started, once it has (None before)."""
    try:
        kids = Path(f"/proc/{serve_pid}/task/{serve_pid}/children").read_text().split()
        return next((int(p) for p in kids if b"collocate.estimate.warm" in Path(f"/proc/{p}/cmdline").read_bytes()),
                    None)
    except OSError:
        return None


def compare_cli(args: argparse.Namespace) -> dict[str, object]:
    """Cold and warm `collocate estimate`, alternating, ``args.cli_repeats`` times each; the warm
    one answered by the warm estimator of a daemon started as a user starts it (`collocate serve`,
    no option), found as a member's command finds it (no option: the per-user state dir)."""
    collocate = str(Path(sys.executable).with_name("collocate"))
    argv = [collocate, "estimate", args.entry, "--batch-size", str(args.batch_size), "--gpu", args.gpu,
            "--format", "json"]
    with tempfile.TemporaryDirectory() as home:
        state = Path(home) / "collocate"
        env = {k: v for k, v in os.environ.items() if k not in ("COLLOCATE_STATE_DIR", "COLLOCATE_NO_WARM_ESTIMATOR")}
        env |= {"XDG_STATE_HOME": home, "COLLOCATE_LAB_STATE_DIR": str(Path(home) / "no-lab")}
        sock = state / "estimator.sock"
        t0 = time.perf_counter()
        daemon = subprocess.Popen([collocate, "serve", "--gpus", "emulated:1xA100-80GB"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            answers_s = None
            while not sock.exists():
                if daemon.poll() is not None:
                    raise SystemExit("the daemon did not start")
                if answers_s is None and (state / "collocate.sock").exists():
                    answers_s = time.perf_counter() - t0
                time.sleep(0.1)
            ready_s = time.perf_counter() - t0
            server = warm_estimator_pid(daemon.pid)
            if server is None:
                raise SystemExit("the daemon's warm estimator is not its child")
            server_rss = int(Path(f"/proc/{server}/status").read_text()
                             .split("VmRSS:")[1].split()[0]) / 1024
            cold, warm = [], []
            for i in range(args.cli_repeats):
                out_cold, c = run_cli([*argv, "--cold"], env)
                before = children_cpu_s(server)
                out_warm, w = run_cli(argv, env)
                deadline = time.monotonic() + 5  # the warm process reaps its child within 1 s
                while children_cpu_s(server) == before and time.monotonic() < deadline:
                    time.sleep(0.05)
                w["client_cpu_s"] = w["cpu_s"]
                w["cpu_s"] += children_cpu_s(server) - before
                if w["cpu_s"] == w["client_cpu_s"]:
                    raise SystemExit("the warm estimator did not answer: the command estimated cold")
                if out_cold != out_warm:
                    raise SystemExit(f"cold and warm answers differ:\n{out_cold}\n{out_warm}")
                cold.append(c)
                warm.append(w)
                print(f"cli {i + 1}: cold {c['wall_s']:.2f} s wall, {c['cpu_s']:.2f} s CPU, "
                      f"{c['peak_rss_mib']:.0f} MiB; warm {w['wall_s']:.2f} s wall, "
                      f"{w['cpu_s']:.2f} s CPU ({w['client_cpu_s']:.2f} s in the command), "
                      f"{w['peak_rss_mib']:.0f} MiB; load {os.getloadavg()[0]:.1f}")
        finally:
            daemon.terminate()
            daemon.wait()

    def med(runs: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    return {"command": ["collocate", *argv[1:]], "daemon_answers_s": answers_s, "warm_estimator_ready_s": ready_s,
            "warm_estimator_rss_mib": server_rss,
            "identical_output": True, "answer": json.loads(out_cold), "cold_median": med(cold),
            "warm_median": med(warm), "cold": cold, "warm": warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entry", default="collocate.workloads.models:build_resnet50")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--gpu", default="A100-80GB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cli-repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default="", help="appended to the result's name, e.g. b for -2026-11-29b")
    args = ap.parse_args()

    load_before = os.getloadavg()
    runs = []
    for i in range(args.repeats):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, args.entry, str(args.batch_size), args.gpu],
            capture_output=True, text=True, check=True,
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"run {i + 1}: estimate {runs[-1]['estimate_s']:.2f} s, "
              f"warm {runs[-1]['warm_estimate_s']:.2f} s, "
              f"total {runs[-1]['total_s']:.2f} s, peak RSS {runs[-1]['peak_rss_mib']:.0f} MiB")

    def summary(key: str) -> dict[str, float]:
        vals = [r[key] for r in runs]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    now = dt.datetime.now(dt.timezone.utc)
    result = {
        "benchmark": "estimate_speed",
        "entry_point": args.entry,
        "batch_size": args.batch_size,
        "gpu_type_modelled": args.gpu,
        "device": "cpu",
        "machine": {"cpu_model": cpu_model(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "load_average_1_5_15min_before": [round(x, 2) for x in load_before],
        "load_average_1_5_15min_after": [round(x, 2) for x in os.getloadavg()],
        "torch_version": runs[0]["torch"],
        "torch_threads": runs[0]["threads"],
        "date_utc": now.isoformat(timespec="seconds"),
        "repeats": args.repeats,
        "estimate_s": summary("estimate_s"),
        "total_s_including_imports": summary("total_s"),
        "warm_estimate_s": summary("warm_estimate_s"),
        "peak_rss_mib": summary("peak_rss_mib"),
        "estimate_mib": runs[0]["mib"],
        "method": runs[0]["method"],
        "targets": {"estimate_s": 5.0, "peak_rss_mib": 2048},
        "runs": runs,
    }
    if args.cli_repeats > 0:
        result["cli"] = compare_cli(args)
        result["load_average_1_5_15min_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"estimate_speed-{now.date().isoformat()}{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"median estimate {result['estimate_s']['median']:.2f} s, "
          f"median total {result['total_s_including_imports']['median']:.2f} s, "
          f"max peak RSS {result['peak_rss_mib']['max']:.0f} MiB -> {path}")


if __name__ == "__main__":
    main()
