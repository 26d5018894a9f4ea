"""What knowing every job's duration would buy: the CARMA traces with the queue in oracle order.

    PYTHONPATH=src python benchmarks/oracle_order.py [--data ../shared/data] [--out FILE]

No policy here can know a job's duration (the daemon does not), so this is a bound on one
lever, not a rule to ship: the same placement policy is handed its queue in FIFO order (as
always), longest work first (GPUs x solo duration, from the trace: an oracle), or multi-GPU
jobs first (which needs no oracle). Issue 21 asks `auto` to close 60% (time-slicing) and 75%
(MPS) of the gap between exclusive and the model floor on carma-heavy-60 and carma-mix-90;
this says how much of that queue order alone could give, and at what cost in mean JCT.
Deterministic, CPU only; writes JSON with --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Sequence
from pathlib import Path

from collocate.core.gputypes import parse_cluster
from collocate.core.model import ClusterSnapshot, Job, Plan, SharingMode
from collocate.core.policies import make_policy
from collocate.core.policies.base import Policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.trace import load_catalogue, load_trace

ORDERS = ("fifo", "longest-work-first", "multi-gpu-first")


class Reordered:
    """``policy`` handed its queue in another order."""

    def __init__(self, policy: Policy, order: str, work_s: dict[str, float]) -> None:
        self.policy, self.order, self.work_s = policy, order, work_s
        self.name = policy.name

    def __getattr__(self, name: str):  # settle_s and the like, as the simulator reads them
        return getattr(self.policy, name)

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        if self.order == "longest-work-first":
            queue = sorted(queue, key=lambda j: -self.work_s[j.id])
        elif self.order == "multi-gpu-first":
            queue = sorted(queue, key=lambda j: -j.gpus)
        return self.policy(queue, cluster)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    catalogue = load_catalogue(args.data / "carma-workloads.csv")
    rows = []
    for trace in ("carma-heavy-60", "carma-mix-90"):
        jobs = load_trace(args.data / f"{trace}.csv", catalogue)
        work_s = {j.id: j.workload.gpus * j.workload.duration_s for j in jobs}
        for sharing in ("time-slicing", "mps"):
            for policy in ("carma-magm", "auto"):
                for order in ORDERS:
                    s = summarize(Simulation(parse_cluster("4xA100-40GB"), jobs,
                                             Reordered(make_policy(policy), order, work_s),
                                             SimConfig(sharing=SharingMode(sharing))).run())
                    rows.append({"trace": trace, "sharing": sharing, "policy": policy, "order": order,
                                 "makespan_min": round(s.makespan_min, 2), "mean_jct_min": round(s.mean_jct_min, 2),
                                 "p95_jct_min": round(s.p95_jct_min, 2)})
                    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": "2-core CPU dev machine, no GPU",
                                        "date": datetime.date.today().isoformat(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
