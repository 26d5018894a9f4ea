"""Fair share against first-come on a lab trace where one user floods the queue.

    python benchmarks/multi_user.py [--seeds 0,1,2] [--policies exclusive,auto]

One user (``flood``) submits 200 one-GPU jobs in the first minute on 8 GPUs; three others submit
12 jobs each over 8 hours (``collocate.sim.users.flood_trace``). Each policy runs twice: with
fair share (the default, ``collocate.core.fairness``) and first-come (``fair_share=False``). Per
user: mean and worst wait, and the wait of their first job, which the issue bounds by one job's
length (the longest job in the trace, as a non-preemptive scheduler can only promise that);
and the cluster's makespan. Writes benchmarks/results/multi_user-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

from collocate.core.fairness import Fairness
from collocate.core.gputypes import parse_cluster
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.users import flood_trace, user_waits

CLUSTER = "8xA100-40GB"


def run(seeds: list[int], policies: list[str]) -> list[dict]:
    nodes = parse_cluster(CLUSTER)
    rows = []
    for seed in seeds:
        trace = flood_trace(gpus=8, seed=seed)
        longest = max(tj.workload.duration_s for tj in trace)
        for name in policies:
            for fair in (True, False):
                config = SimConfig(fairness=Fairness(fair_share=fair))
                result = Simulation(nodes, trace, make_policy(name), config).run()
                users = user_waits(result, trace)
                others = [u for u in users if u.user != "flood"]
                rows.append({
                    "seed": seed, "policy": name, "order": "fair share" if fair else "first-come",
                    "makespan_h": round(result.makespan_s / 3600, 3),
                    "longest_job_h": round(longest / 3600, 3),
                    "users": [{"user": u.user, "jobs": u.jobs, "mean_wait_h": round(u.mean_wait_s / 3600, 3),
                               "max_wait_h": round(u.max_wait_s / 3600, 3),
                               "first_wait_h": round(u.first_wait_s / 3600, 3)} for u in users],
                    "others_mean_wait_h": round(statistics.fmean(u.mean_wait_s for u in others) / 3600, 3),
                    "others_first_within_one_job": all(u.first_wait_s <= longest for u in others),
                })
                print({k: v for k, v in rows[-1].items() if k != "users"}, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--policies", default="exclusive,auto")
    args = parser.parse_args()
    doc = {"machine": {**machine(), "note": "2-core CPU dev machine, no GPU (simulation only)"},
           "cluster": CLUSTER, "trace": "flood_trace(gpus=8): flood 200 jobs in 60 s, u1-u3 12 jobs "
           "each over 8 h; durations log-normal median 30 min, cap 2 h",
           "runs": run([int(s) for s in args.seeds.split(",")], args.policies.split(","))}
    out = Path(__file__).parent / "results" / f"multi_user-{doc['machine']['date']}"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Fair share vs first-come on a flooded lab queue, {doc['machine']['date']}", "",
             f"Machine: {doc['machine']['host_cpu']}, {doc['machine']['cores']} cores, no GPU "
             f"(simulation). Cluster {CLUSTER}; trace: {doc['trace']}. "
             "`python benchmarks/multi_user.py`.", "",
             "| seed | policy | order | makespan h | flood mean wait h | others' mean wait h "
             "| others' worst first-job wait h | longest job h | first job within one job |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in doc["runs"]:
        flood = next(u for u in r["users"] if u["user"] == "flood")
        first = max(u["first_wait_h"] for u in r["users"] if u["user"] != "flood")
        lines.append(f"| {r['seed']} | {r['policy']} | {r['order']} | {r['makespan_h']} | "
                     f"{flood['mean_wait_h']} | {r['others_mean_wait_h']} | {first} | "
                     f"{r['longest_job_h']} | {'yes' if r['others_first_within_one_job'] else 'no'} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
