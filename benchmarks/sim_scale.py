"""Simulator and policy speed: jobs per second at 1k/10k/100k jobs on 1,000 GPUs, and the
latency of one placement decision at 1,000 GPUs.

    python benchmarks/sim_scale.py [--sizes 1000,10000,100000] [--policies carma-magm,auto]

Writes benchmarks/results/sim_scale-<date>.json and .md. Targets (issue #2): each 100k-job run
under 60 s on a 2-core CPU machine; one decision at 1,000 GPUs with a median under 1 ms.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

from collocate.core.gputypes import parse_cluster
from collocate.core.model import (
    ClusterSnapshot,
    GpuId,
    GpuView,
    Job,
    JobProfile,
    Utilization,
)
from collocate.core.policies import make_policy
from collocate.sim.engine import Simulation
from collocate.sim.synth import synthetic_trace

CLUSTER = "125x(8xA100-80GB)"  # 1,000 GPUs


def throughput(sizes: list[int], policies: list[str]) -> list[dict]:
    rows = []
    nodes = parse_cluster(CLUSTER)
    for size in sizes:
        trace = synthetic_trace(size, gpus=1000, gpu_mem_mib=81_920, seed=1)
        for name in policies:
            start = time.perf_counter()
            result = Simulation(nodes, trace, make_policy(name)).run()
            seconds = time.perf_counter() - start
            rows.append({"jobs": size, "policy": name, "seconds": round(seconds, 2),
                         "jobs_per_s": round(size / seconds), "decisions": result.decisions})
            print(rows[-1], flush=True)
    return rows


def decision_latency(policies: list[str], repeats: int = 300) -> list[dict]:
    """Placing one job on a busy 1,000-GPU snapshot (queue of 1), and a whole round that places
    what it can from a 64-job queue."""
    views = []
    for i in range(1000):
        jobs = tuple(f"r{i}-{k}" for k in range(1 + i % 3))
        views.append(GpuView(GpuId(f"n{i // 8}", i % 8), 81_920.0, 81_920.0 - 20_000 * len(jobs) / 2,
                             10_000.0 * len(jobs), Utilization(0.3 + 0.1 * (i % 5), 0.3, 0.2), jobs))
    cluster = ClusterSnapshot.from_views(views, now=1e6)
    queue = [Job(f"q{k}", gpus=1 + (k % 7 == 0), mem_mib=4000.0 + 500 * (k % 9), mem_source="declared",
                 profile=JobProfile(0.2 + 0.05 * (k % 10), 0.1)) for k in range(64)]
    rows = []
    for name in policies:
        policy = make_policy(name)
        for depth in (1, len(queue)):
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                plan = policy(queue[:depth], cluster)
                samples.append((time.perf_counter() - start) * 1000)
            samples.sort()
            rows.append({"policy": name, "gpus": 1000, "queue": depth, "placed": len(plan.placements),
                         "median_ms": round(statistics.median(samples), 3),
                         "p99_ms": round(samples[math.ceil(0.99 * len(samples)) - 1], 3)})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--policies", default="carma-magm,auto")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    policies = args.policies.split(",")
    doc = {"machine": machine(), "cluster": CLUSTER,
           "decision": decision_latency(policies),
           "throughput": throughput(sizes, policies)}
    out = Path(__file__).parent / "results" / f"sim_scale-{doc['machine']['date']}"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Simulator scale, {doc['machine']['date']}", "",
             f"Machine: {doc['machine']['host_cpu']}, {doc['machine']['cores']} cores, device cpu. "
             f"Cluster {CLUSTER} (1,000 GPUs), synthetic trace seed 1.", "",
             "| jobs | policy | seconds | jobs/s | decisions |", "|---:|---|---:|---:|---:|"]
    lines += [f"| {r['jobs']} | {r['policy']} | {r['seconds']} | {r['jobs_per_s']} | {r['decisions']} |"
              for r in doc["throughput"]]
    lines += ["", "One scheduling round on a busy 1,000-GPU snapshot:", "",
              "| policy | GPUs | queue | placed | median ms | p99 ms |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['policy']} | {r['gpus']} | {r['queue']} | {r['placed']} | {r['median_ms']} | {r['p99_ms']} |"
              for r in doc["decision"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
