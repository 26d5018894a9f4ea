"""Do multi-GPU jobs starve under `auto`? Mean wait by GPU count against `carma-lug` (issue 21).

    PYTHONPATH=src python benchmarks/starvation.py [--jobs 600] [--seed 1] [--load 0.9]
        [--cluster 8xA100-40GB] [--sharing time-slicing] [--policy auto,carma-lug]
        [--param NAME=VALUE ...]

Prints one JSON document: per policy, makespan, mean JCT, and mean wait (minutes) of the jobs
of each GPU count. Deterministic, CPU only.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy, parse_params, policy_parameters
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.synth import synthetic_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--cluster", default="8xA100-40GB")
    ap.add_argument("--sharing", default="time-slicing")
    ap.add_argument("--policy", default="auto,carma-lug")
    ap.add_argument("--param", action="append", default=[])
    args = ap.parse_args()
    nodes = parse_cluster(args.cluster)
    jobs = synthetic_trace(args.jobs, gpus=sum(n.count for n in nodes),
                           gpu_mem_mib=min(n.gpu_type.memory_mib for n in nodes),
                           max_gpus_per_job=max(n.count for n in nodes), seed=args.seed, load=args.load)
    params = parse_params(args.param)
    out = {"jobs": args.jobs, "seed": args.seed, "load": args.load, "cluster": args.cluster,
           "sharing": args.sharing, "params": params, "policies": {}}
    for name in args.policy.split(","):
        policy = make_policy(name, **{k: v for k, v in params.items() if k in policy_parameters(name)})
        result = Simulation(nodes, jobs, policy, SimConfig(sharing=SharingMode(args.sharing))).run()
        waits = defaultdict(list)
        for r in result.records:
            if r.start is not None:
                waits[r.gpus].append((r.start - r.submit) / 60.0)
        s = summarize(result)
        out["policies"][name] = {
            "makespan_min": s.makespan_min, "mean_jct_min": s.mean_jct_min, "mean_wait_min": s.mean_wait_min,
            "mean_wait_by_gpus_min": {g: round(sum(w) / len(w), 1) for g, w in sorted(waits.items())},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
