"""The MIG tables of docs/simulator.md: carma-heavy-60 on 4xA100-40GB split into MIG instances,
against time-slicing and MPS on the same jobs.

    PYTHONPATH=src python benchmarks/mig_tables.py [--data ../shared/data] [--out benchmarks/results]

Two tables. First the whole trace under the default layout (3g.20gb+4g.20gb), where some jobs
fit no instance and are rejected. Then, like for like, only the jobs every layout admits (a job
rejected under any layout below is left out of every row): time-slicing and MPS on whole GPUs
and inside the instances of three layouts (an instance is shared by the mode, as a whole GPU).
`exclusive` never shares a device, so its MPS run is its time-slicing run and is not repeated.
Deterministic, CPU only; writes mig_tables-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.trace import load_catalogue, load_trace

CLUSTER = "4xA100-40GB"
DEFAULT_LAYOUT = "3g.20gb+4g.20gb"
LAYOUTS = (DEFAULT_LAYOUT, "2g.10gb+2g.10gb+3g.20gb", "7g.40gb")
POLICIES = ("exclusive", "carma-magm", "auto")
METRICS = ("makespan_min", "mean_jct_min", "p95_jct_min", "mean_wait_min", "sm_util", "mem_util",
           "energy_kwh", "oom_crashes", "done", "rejected")


def simulate(jobs, policy: str, sharing: SharingMode, layout: str | None) -> dict:
    result = Simulation(parse_cluster(CLUSTER), jobs, make_policy(policy),
                        SimConfig(sharing=sharing, mig_layout=layout)).run()
    summary = summarize(result).as_dict()
    return {k: summary[k] for k in METRICS}


def admitted_everywhere(jobs) -> tuple[list, list[str]]:
    """The jobs no layout rejects, and the names of those left out."""
    rejected: set[str] = set()
    for layout in LAYOUTS:
        result = Simulation(parse_cluster(CLUSTER), jobs, make_policy("exclusive"),
                            SimConfig(mig_layout=layout)).run()
        rejected |= {r.id for r in result.records if r.state == "rejected"}
    names = Counter(j.workload.name for j in jobs if j.id in rejected)
    return [j for j in jobs if j.id not in rejected], [f"{n} x{c}" if c > 1 else n for n, c in sorted(names.items())]


def run(data: Path) -> dict:
    jobs = load_trace(data / "carma-heavy-60.csv", load_catalogue(data / "carma-workloads.csv"))
    whole = [{"policy": p, **simulate(jobs, p, SharingMode.TIME_SLICING, DEFAULT_LAYOUT)} for p in POLICIES]
    kept, left_out = admitted_everywhere(jobs)
    like = []
    for layout in (None, *LAYOUTS):
        for sharing in (SharingMode.TIME_SLICING, SharingMode.MPS):
            for p in POLICIES:
                if p == "exclusive" and sharing is SharingMode.MPS:
                    continue
                label = sharing.value if layout is None else f"{sharing.value} in mig {layout}"
                like.append({"sharing": label, "policy": p, **simulate(kept, p, sharing, layout)})
    return {"whole_trace": whole, "kept_jobs": len(kept), "left_out": left_out, "like_for_like": like}


def markdown(doc: dict, info: dict) -> str:
    def cells(r: dict) -> str:
        return (f"{r['makespan_min']:.1f} | {r['mean_jct_min']:.1f} | {r['p95_jct_min']:.1f} | "
                f"{r['mean_wait_min']:.1f} | {r['sm_util']:.2f} | {r['energy_kwh']:.2f}")

    lines = [
        "# MIG tables (simulated)", "",
        f"{info['date']}, {info['host_cpu']} ({info['cores']} cores), simulator only (no GPU): "
        "`python benchmarks/mig_tables.py`. carma-heavy-60 on 4xA100-40GB, measured-peak estimates. "
        "Times in minutes.", "",
        f"Whole trace, MIG layout {DEFAULT_LAYOUT}, time-sliced instances:", "",
        "| policy | makespan | JCT mean | JCT p95 | wait | SM util | kWh | mem util | OOM | done | rej. |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["whole_trace"]:
        lines.append(f"| {r['policy']} | {cells(r)} | {r['mem_util']:.2f} | {r['oom_crashes']} | {r['done']} "
                     f"| {r['rejected']} |")
    lines += ["", f"Like for like: the {doc['kept_jobs']} jobs every layout admits (left out: {', '.join(doc['left_out'])}):", "",
              "| sharing / layout | policy | makespan | JCT mean | JCT p95 | wait | SM util | kWh |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["like_for_like"]:
        lines.append(f"| {r['sharing']} | {r['policy']} | {cells(r)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parents[2] / "shared" / "data",
                        help="folder with the CARMA traces and workload catalogue")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if not (args.data / "carma-workloads.csv").is_file():
        parser.error(f"no CARMA traces in {args.data}: pass --data with the shared data folder")
    info = machine()
    doc = run(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"mig_tables-{info['date']}"
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, **doc}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(doc, info))
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
