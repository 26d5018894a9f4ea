"""The simulator tables of docs/simulator.md, with each policy's share of the exclusive-to-floor gap.

    PYTHONPATH=src python benchmarks/floor_tables.py [--data ../shared/data] [--synthetic]
        [--out benchmarks/results/floor_tables-DATE]

CARMA traces on 4xA100-40GB (time-slicing and MPS) and, with --synthetic, 600 synthetic jobs on
8xA100-40GB (seed 2 at load 0.9, seed 1 at load 0.9). With --grid instead: issue 21's synthetic
grid, 600 and 5,000 jobs (--sizes) on 8xA100-40GB and 2x(8xH100-80GB) at loads 0.6, 0.9 and
1.2 (seed --seed, 3 by default: one no rule was designed on). The model floor of a 5,000-job
trace takes minutes per case on a 2-core machine; `benchmarks/auto_family.py --family grid-5000`
compares the policies on those traces without floors. Writes OUT.json and OUT.md. Needs scipy
(the model floor). Deterministic, CPU only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.floor import floors, gap_closed
from collocate.sim.metrics import summarize
from collocate.sim.synth import synthetic_trace
from collocate.sim.trace import load_catalogue, load_trace

CARMA_POLICIES = ("exclusive", "shares", "declared-memory", "round-robin", "carma-ff", "carma-bf",
                  "carma-magm", "carma-lug", "auto")
SYNTH_POLICIES = ("exclusive", "carma-ff", "carma-bf", "carma-magm", "carma-lug", "auto")
GRID = [(n, cluster, load) for n in (600, 5000) for cluster in ("8xA100-40GB", "2x(8xH100-80GB)")
        for load in (0.6, 0.9, 1.2)]


def run_case(label, jobs, cluster, sharing, policies):
    nodes = parse_cluster(cluster)
    mode = SharingMode(sharing)
    f = floors(jobs, nodes, mode)
    rows = [summarize(Simulation(nodes, jobs, make_policy(p), SimConfig(sharing=mode)).run()).as_dict()
            for p in policies]
    exclusive = next(r["makespan_min"] for r in rows if r["policy"] == "exclusive")
    model, sm = f.model_floor_s / 60, f.sm_floor_s / 60
    for r in rows:
        r["gap_closed_model"] = round(gap_closed(r["makespan_min"], exclusive, model), 3)
        r["gap_closed_sm"] = round(gap_closed(r["makespan_min"], exclusive, sm), 3)
    return {"case": label, "cluster": cluster, "sharing": sharing,
            "floor": {k: (round(v / 60, 2) if isinstance(v, float) else v) for k, v in f.as_dict().items()},
            "policies": rows}


def markdown(case) -> str:
    f = case["floor"]
    lines = [f"### {case['case']}, {case['cluster']}, {case['sharing']}", "",
             f"Floors (min): arrival {f['arrival_floor_s']}, SM {f['sm_floor_s']}, model {f['model_floor_s']} "
             f"(certified; LP {f['model_lp_s']}, {f['mixes']} mixes, {f['job_types']} job types).", "",
             "| policy | makespan | JCT mean | JCT p95 | wait | SM util | kWh | OOM | failed | gap closed, model | gap closed, SM |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in case["policies"]:
        lines.append(f"| {r['policy']} | {r['makespan_min']:.1f} | {r['mean_jct_min']:.1f} | {r['p95_jct_min']:.1f} | "
                     f"{r['mean_wait_min']:.1f} | {r['sm_util']:.2f} | {r['energy_kwh']:.2f} | {r['oom_crashes']} | "
                     f"{r['failed']} | {r['gap_closed_model']:.2f} | {r['gap_closed_sm']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--sizes", default="600,5000", help="--grid: trace sizes, comma-separated")
    ap.add_argument("--out", type=Path, default=Path(f"benchmarks/results/floor_tables-{datetime.date.today()}"))
    args = ap.parse_args()
    catalogue = load_catalogue(args.data / "carma-workloads.csv")
    cases = []
    for trace in () if args.grid else ("carma-heavy-60", "carma-mix-90"):
        jobs = load_trace(args.data / f"{trace}.csv", catalogue)
        for sharing in ("time-slicing", "mps"):
            cases.append(run_case(trace, jobs, "4xA100-40GB", sharing, CARMA_POLICIES))
    sizes = {int(x) for x in args.sizes.split(",")}
    for n, cluster, load in [g for g in GRID if g[0] in sizes] if args.grid else ():
        nodes = parse_cluster(cluster)
        jobs = synthetic_trace(n, gpus=sum(x.count for x in nodes), gpu_mem_mib=min(x.gpu_type.memory_mib for x in nodes),
                               max_gpus_per_job=max(x.count for x in nodes), seed=args.seed, load=load)
        for sharing in ("time-slicing", "mps"):
            cases.append(run_case(f"{n} synthetic jobs, seed {args.seed}, load {load}", jobs, cluster, sharing, SYNTH_POLICIES))
            print(cases[-1]["case"], cluster, sharing, flush=True)
    if args.synthetic:
        for seed in (2, 1):
            jobs = synthetic_trace(600, gpus=8, gpu_mem_mib=40_536.0, max_gpus_per_job=8, seed=seed, load=0.9)
            for sharing in ("time-slicing", "mps"):
                cases.append(run_case(f"600 synthetic jobs, seed {seed}, load 0.9", jobs, "8xA100-40GB", sharing, SYNTH_POLICIES))
    machine = f"{platform.machine()} CPU dev machine ({platform.processor() or 'cpu'}), no GPU"
    doc = {"machine": machine, "date": str(datetime.date.today()), "cases": cases}
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    args.out.with_suffix(".md").write_text(
        f"# Simulator tables with floors\n\n{machine}; {doc['date']}; `benchmarks/floor_tables.py`. "
        "Times in minutes; gap closed = (exclusive - makespan) / (exclusive - floor).\n\n"
        + "\n".join(markdown(c) for c in cases))


if __name__ == "__main__":
    main()
