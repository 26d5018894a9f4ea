"""What the daemon's NVML sampling costs on a real GPU: a training job's speed and the CPU.

Two measurements, side by side in one run:

1. **Training speed**: a small, launch-bound workload (``resnet18-cifar``, the most sensitive
   to anything else talking to the driver) trains alone and while
   ``monitor_overhead.py --backend nvml`` samples the GPU every ``--period`` seconds (0.1 by
   default: ten times the daemon's rate, an upper bound). Runs alternate A B B A ... so drift
   cancels; the result is the ratio of the median throughputs.
2. **CPU**: ``monitor_overhead.py --backend nvml`` at the daemon's 1 s period while the workload
   trains, which reports the backend's read (NVML, GPM) and the monitoring layer per tick.

    python benchmarks/gpu/monitor_gpu_cost.py --out-dir $OUT/monitor     # on the GPU
    python benchmarks/gpu/monitor_gpu_cost.py --device cpu --pairs 1 --seconds 1 --out-dir /tmp/m

Writes ``monitor_gpu_cost.json`` and the CPU run's ``monitor_overhead-nvml-<date>.{json,md}``
into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
OVERHEAD = HERE.parent / "monitor_overhead.py"


def train(workload: str, device: str, seconds: float, out: Path) -> float:
    """One worker run; its measured samples per second."""
    subprocess.run([sys.executable, "-m", "collocate.bench.worker", "--workload", workload,
                    "--device", device, "--seconds", str(seconds), "--warmup", "3",
                    "--out", str(out)], check=True)
    return json.loads(out.read_text())["samples_per_s"]


def sampler(period: float, seconds: float, out_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(OVERHEAD), "--backend", "nvml", "--period",
                             str(period), "--seconds", str(seconds), "--out", str(out_dir)],
                            stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="resnet18-cifar")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--pairs", type=int, default=3, help="A B (or B A) pairs of runs")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run")
    ap.add_argument("--period", type=float, default=0.1, help="sampling period while training")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="collocate-moncost-"))
    runs: list[dict] = []
    for pair in range(args.pairs):
        order = ("alone", "sampled") if pair % 2 == 0 else ("sampled", "alone")
        for cond in order:
            poller = sampler(args.period, 3600, scratch) if cond == "sampled" else None
            try:
                rate = train(args.workload, args.device, args.seconds,
                             scratch / f"{pair}-{cond}.json")
            finally:
                if poller is not None:
                    poller.terminate()
                    poller.wait()
            runs.append({"pair": pair, "condition": cond, "samples_per_s": round(rate, 1)})
            print(f"pair {pair} {cond}: {rate:.1f} samples/s", flush=True)
    median = {c: statistics.median(r["samples_per_s"] for r in runs if r["condition"] == c)
              for c in ("alone", "sampled")}
    # CPU: the daemon's period while the workload trains.
    cpu_seconds = 20.0 if args.device == "cuda" else 2.0
    worker = subprocess.Popen([sys.executable, "-m", "collocate.bench.worker", "--workload",
                               args.workload, "--device", args.device, "--seconds",
                               str(cpu_seconds + 15), "--out", str(scratch / "cpu-run.json")])
    try:
        subprocess.run([sys.executable, str(OVERHEAD), "--backend", "nvml", "--period", "1",
                        "--seconds", str(cpu_seconds), "--out", str(args.out_dir)], check=True)
    finally:
        worker.terminate()
        worker.wait()
    result = {"benchmark": "monitor_gpu_cost", "workload": args.workload,
              "device": args.device, "sampling_period_s": args.period,
              "seconds_per_run": args.seconds, "runs": runs,
              "median_samples_per_s": median,
              "sampled_over_alone": round(median["sampled"] / median["alone"], 4)}
    (args.out_dir / "monitor_gpu_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_samples_per_s", "sampled_over_alone")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
