"""What knowing each job's activity profile is worth to ``auto``, and how much of it the daemon's
learning (``collocate.core.world``) recovers: the same traces simulated with the policies told the
trace's profiles, told nothing (``"blind"``: every job priced at 0.5 SM / 0.2 DRAM), told all a
fresh daemon learns as the trace runs (``"unknown"``: every GPU's readings revise the beliefs of
the jobs on it, alone or shared; a job's history; its family's prior), and the same without
family priors (``"learned"``). In the CARMA traces jobs of one catalogue workload share a
command and the workloads of one model and dataset (other batch sizes) a family; every
synthetic job has a command and no family of its own. The catalogue gives one model and dataset
one profile, so the family prior is exact there: an upper bound on what it is worth.

    python benchmarks/profile_knowledge.py [--data ../shared/data] [--synthetic 2000] [--seeds 1,2,3]

Writes benchmarks/results/profile_knowledge-<date>.json and .md. Deterministic: the simulator has
no randomness beyond the synthetic traces' seeds, so a rerun on any machine gives the same numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine
from rich.progress import track

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import PROFILE_KNOWLEDGE, SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.synth import synthetic_trace
from collocate.sim.trace import load_catalogue, load_trace

CARMA_CLUSTER = "4xA100-40GB"
SYNTHETIC_CLUSTER = "4x(8xA100-80GB)"
MODES = (SharingMode.TIME_SLICING, SharingMode.MPS)
METRICS = ("makespan_min", "mean_jct_min", "p95_jct_min", "sm_util", "energy_kwh", "oom_crashes")


def traces(data: Path, synthetic: int, seeds: list[int]) -> list[tuple[str, str, list]]:
    """(name, cluster, jobs) for the shared CARMA traces and the seeded synthetic ones."""
    out = []
    catalogue = load_catalogue(data / "carma-workloads.csv")
    for name in ("carma-heavy-60", "carma-mix-90"):
        out.append((name, CARMA_CLUSTER, load_trace(data / f"{name}.csv", catalogue)))
    gpus = sum(n.count for n in parse_cluster(SYNTHETIC_CLUSTER))
    for seed in seeds:
        jobs = synthetic_trace(synthetic, gpus=gpus, gpu_mem_mib=81_920, max_gpus_per_job=8, seed=seed)
        out.append((f"synthetic-{synthetic}-seed{seed}", SYNTHETIC_CLUSTER, jobs))
    return out


def run(data: Path, synthetic: int, seeds: list[int]) -> list[dict]:
    cases = [(t, mode, profiles) for t in traces(data, synthetic, seeds) for mode in MODES
             for profiles in PROFILE_KNOWLEDGE]
    rows = []
    for (name, cluster, jobs), mode, profiles in track(cases, description="simulating"):
        config = SimConfig(sharing=mode, profiles=profiles)
        result = Simulation(parse_cluster(cluster), jobs, make_policy("auto"), config).run()
        summary = summarize(result).as_dict()
        rows.append({"trace": name, "cluster": cluster, "sharing": mode.value,
                     "profiles": profiles, **{k: summary[k] for k in METRICS}})
    return rows


def recovered(rows: list[dict], metric: str, knowing: str = "learned"
              ) -> dict[tuple[str, str], float | None]:
    """Per (trace, sharing): the share of the told-nothing → told-everything change in ``metric``
    that ``knowing`` achieves (1 = all of it; None when knowing changes nothing)."""
    by = {(r["trace"], r["sharing"], r["profiles"]): r[metric] for r in rows}
    out = {}
    for trace, sharing in {(r["trace"], r["sharing"]) for r in rows}:
        told, blind, known = (by[(trace, sharing, p)] for p in ("trace", "blind", knowing))
        gap = blind - told
        out[(trace, sharing)] = None if abs(gap) < 1e-9 else (blind - known) / gap
    return out


def markdown(rows: list[dict], info: dict) -> str:
    lines = [
        "# What knowing job profiles is worth to `auto` (simulated)",
        "",
        f"{info['date']}, {info['host_cpu']} ({info['cores']} cores), simulator only (no GPU): "
        "`python benchmarks/profile_knowledge.py`. Policy `auto`, measured-peak memory estimates; "
        "`trace`: policies told every job's profile; `blind`: told nothing (0.5 SM / 0.2 DRAM "
        "for every job); `unknown`: all a fresh daemon learns as the trace runs (every GPU's "
        "readings revise the beliefs of the jobs on it, alone or shared; a job's history, from "
        "submission on, for a command (catalogue workload) that ran before; a new command's family "
        "prior from the catalogue's other batch sizes of one model and dataset, which share one "
        "profile: an upper bound); `learned`: as unknown without family priors. Every synthetic "
        "job has a command of its own and no family. Times in minutes.",
        "",
        "| trace | sharing | profiles | makespan | JCT mean | JCT p95 | SM util | kWh | OOM |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['sharing']} | {r['profiles']} | {r['makespan_min']:.1f} "
                     f"| {r['mean_jct_min']:.1f} | {r['p95_jct_min']:.1f} | {r['sm_util']:.2f} "
                     f"| {r['energy_kwh']:.4g} | {r['oom_crashes']} |")
    lines += ["", "Share of the blind → trace change that `unknown` (all a fresh daemon learns) "
              "and `learned` achieve (1.00 = all of it, 0 = none, negative = moved the other "
              "way; – = knowing changed nothing). Where the change itself is a few minutes (most "
              "makespans) the share is noise:",
              "", "| trace | sharing | makespan, unknown | JCT mean, unknown | makespan, learned "
              "| JCT mean, learned |",
              "|---|---|---:|---:|---:|---:|"]
    columns = [recovered(rows, metric, knowing) for knowing in ("unknown", "learned")
               for metric in ("makespan_min", "mean_jct_min")]
    for key in sorted(columns[0]):
        cells = ["–" if c[key] is None else f"{c[key]:.2f}" for c in columns]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parents[2] / "shared" / "data",
                        help="folder with the CARMA traces and workload catalogue")
    parser.add_argument("--synthetic", type=int, default=2000, help="jobs per synthetic trace")
    parser.add_argument("--seeds", default="1,2,3", help="synthetic trace seeds, comma-separated")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if not (args.data / "carma-workloads.csv").is_file():
        parser.error(f"no CARMA traces in {args.data}: pass --data with the shared data folder")
    info = machine()
    rows = run(args.data, args.synthetic, [int(s) for s in args.seeds.split(",")])
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"profile_knowledge-{info['date']}"
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(rows, info))
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
