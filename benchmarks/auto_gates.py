"""`auto`'s gates against the floor and the CARMA family on the CARMA traces (issue 21).

    PYTHONPATH=src python benchmarks/auto_gates.py [--data ../shared/data] [--out FILE.json]

Runs `auto` with several min_gain / max_slowdown / pack_tolerance settings on carma-heavy-60 and
carma-mix-90 (4xA100-40GB, time-slicing and MPS) and prints makespan and mean JCT (minutes).
Compare with benchmarks/results/floor_tables-*.md. Deterministic, CPU only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.trace import load_catalogue, load_trace

SETTINGS = (
    {},
    {"min_gain": 0.0},
    {"max_slowdown": 1.5},
    {"max_slowdown": 3.0},
    {"pack_tolerance": 0.0},
    {"pack_tolerance": 0.2},
    {"min_gain": 0.0, "max_slowdown": 3.0},
    {"min_gain": 0.0, "max_slowdown": 3.0, "pack_tolerance": 0.2},
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    catalogue = load_catalogue(args.data / "carma-workloads.csv")
    rows = []
    for trace in ("carma-heavy-60", "carma-mix-90"):
        jobs = load_trace(args.data / f"{trace}.csv", catalogue)
        for sharing in ("time-slicing", "mps"):
            for params in SETTINGS:
                s = summarize(Simulation(parse_cluster("4xA100-40GB"), jobs, make_policy("auto", **params),
                                         SimConfig(sharing=SharingMode(sharing))).run())
                rows.append({"trace": trace, "sharing": sharing, "params": params,
                             "makespan_min": s.makespan_min, "mean_jct_min": s.mean_jct_min,
                             "p95_jct_min": s.p95_jct_min, "oom_crashes": s.oom_crashes})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
