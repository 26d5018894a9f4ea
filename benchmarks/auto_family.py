"""`auto` against the CARMA family over families of traces, not one trace at a time (issue 21).

    PYTHONPATH=src python benchmarks/auto_family.py [--data ../shared/data] [--family NAME ...]
        [--param NAME=VALUE ...] [--model-error-seeds N] [--profiles trace|unknown|...] [--out FILE]

A 60- or 90-job trace on 4 GPUs is chaotic: one placement moved early reorders everything after
it, so a rule change can gain 5% on one trace and lose 5% on the next. This script judges a rule
on many traces at once: per trace, `auto`'s makespan over the best CARMA-family policy's
(carma-ff/bf/magm/lug) and its mean JCT over the best of theirs; per family and sharing mode,
the geometric mean of those ratios, how many traces lose more than 1%, the worst, how many
are worse than exclusive, mean and p95 JCT against the best CARMA policy's, and, as a
yardstick, how often each CARMA policy itself loses to the best of the other three (makespan
and p95 JCT by more than 1%, mean JCT at all). Families:

* ``carma``: carma-heavy-60 and carma-mix-90 on 4xA100-40GB;
* ``carma-estimators``: the same traces with the estimates CARMA compared (horus, faketensor,
  gpumemnet: policies see the estimate, crashes follow the peak);
* ``small-a``: 90 synthetic jobs on 4xA100-40GB at load 1.5, seeds 100-115 (rules were designed
  on these);
* ``small-b``: the same at load 1.2, seeds 200-215 (used to choose between two rules);
* ``small-c``: 120 jobs on 2x(4xA100-40GB) at load 1.0, seeds 300-315 (held out from the first
  two rules; used once, to drop a third);
* ``small-d``: 120 jobs on 3x(4xA100-40GB) at load 1.1, seeds 400-415 (where the gang placement
  rule was found);
* ``small-e``: 100 jobs on 2x(4xH100-80GB) at load 1.3, seeds 500-515 (held out from every rule);
* ``large``: 600 synthetic jobs, 8xA100-40GB (seeds 1, 2 at load 0.9; seed 7 at 0.6 and 1.2) and
  2x(8xH100-80GB) (seed 7 at 1.2, seed 8 at 0.9);
* ``grid-5000``: issue 21's 5,000-job traces, 8xA100-40GB and 2x(8xH100-80GB) at loads 0.6, 0.9
  and 1.2, seed 3 (held out from every rule; not in the default run: about 10 minutes).

With ``--model-error-seeds N`` every policy runs each case under model-error seeds 1..N (jobs in
a mix run at the model's slowdown times a held-out H100 error, ``collocate.sim.model_error``)
and the ratios compare their means: a rule is then judged against a model as wrong as it is on
a real GPU, and single-run chaos averages out. Run it with another checkout's ``src`` first on
PYTHONPATH to compare two versions of `auto`.
Deterministic, CPU only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy, parse_params
from collocate.sim.engine import PROFILE_KNOWLEDGE, SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.synth import synthetic_trace
from collocate.sim.trace import load_catalogue, load_trace

CARMA = ("carma-ff", "carma-bf", "carma-magm", "carma-lug")
FAMILIES = ("carma", "carma-estimators", "small-a", "small-b", "small-c", "small-d", "small-e", "large")


def synthetic(jobs: int, cluster: str, seed: int, load: float):
    nodes = parse_cluster(cluster)
    return synthetic_trace(jobs, gpus=sum(n.count for n in nodes), gpu_mem_mib=min(n.gpu_type.memory_mib for n in nodes),
                           max_gpus_per_job=max(n.count for n in nodes), seed=seed, load=load)


def family(name: str, data: Path):
    """(label, cluster, trace, estimator) of each trace of a family."""
    if name.startswith("carma"):
        catalogue = load_catalogue(data / "carma-workloads.csv")
        estimators = ("horus", "faketensor", "gpumemnet") if name == "carma-estimators" else ("peak",)
        return [(f"{t} {e}", "4xA100-40GB", load_trace(data / f"{t}.csv", catalogue), e)
                for t in ("carma-heavy-60", "carma-mix-90") for e in estimators]
    grids = {
        "small-a": [(90, "4xA100-40GB", s, 1.5) for s in range(100, 116)],
        "small-b": [(90, "4xA100-40GB", s, 1.2) for s in range(200, 216)],
        "small-c": [(120, "2x(4xA100-40GB)", s, 1.0) for s in range(300, 316)],
        "small-d": [(120, "3x(4xA100-40GB)", s, 1.1) for s in range(400, 416)],
        "small-e": [(100, "2x(4xH100-80GB)", s, 1.3) for s in range(500, 516)],
        "grid-5000": [(5000, c, 3, load) for c in ("8xA100-40GB", "2x(8xH100-80GB)") for load in (0.6, 0.9, 1.2)],
        "large": [(600, "8xA100-40GB", 1, 0.9), (600, "8xA100-40GB", 2, 0.9), (600, "8xA100-40GB", 7, 0.6),
                  (600, "8xA100-40GB", 7, 1.2), (600, "2x(8xH100-80GB)", 7, 1.2), (600, "2x(8xH100-80GB)", 8, 0.9)],
    }
    return [(f"{n} jobs {c} seed {s} load {load}", c, synthetic(n, c, s, load), "peak") for n, c, s, load in grids[name]]


@dataclass(frozen=True)
class Outcome:
    """A policy's results on one case, averaged over the model-error seeds (one run without)."""

    makespan_min: float
    mean_jct_min: float
    p95_jct_min: float
    multi_gpu_wait_min: float | None
    failed: float  # jobs that ended failed (mean over the seeds)


def outcome(nodes, jobs, policy, configs: list[SimConfig]) -> Outcome:
    runs = [Simulation(nodes, jobs, policy, c).run() for c in configs]
    summaries = [summarize(r) for r in runs]
    waits = [(r.start - r.submit) / 60 for run in runs for r in run.records if r.gpus > 1 and r.start is not None]
    return Outcome(statistics.fmean(s.makespan_min for s in summaries), statistics.fmean(s.mean_jct_min for s in summaries),
                   statistics.fmean(s.p95_jct_min for s in summaries), statistics.fmean(waits) if waits else None,
                   statistics.fmean(s.failed for s in summaries))


def case(label: str, cluster: str, jobs, estimator: str, sharing: str, auto, error_seeds: int = 0,
         profiles: str = "trace") -> dict:
    nodes = parse_cluster(cluster)
    config = SimConfig(sharing=SharingMode(sharing), estimator=estimator, profiles=profiles)
    configs = [replace(config, model_error_seed=seed) for seed in range(1, error_seeds + 1)] or [config]
    rows = {p: outcome(nodes, jobs, make_policy(p), configs) for p in ("exclusive", *CARMA)}
    s = outcome(nodes, jobs, auto, configs)
    return {
        "trace": label, "cluster": cluster, "sharing": sharing, "auto_makespan_min": round(s.makespan_min, 2),
        "best_carma_makespan_min": round(min(rows[p].makespan_min for p in CARMA), 2),
        "exclusive_makespan_min": round(rows["exclusive"].makespan_min, 2),
        "makespan_ratio": s.makespan_min / min(rows[p].makespan_min for p in CARMA),
        "jct_ratio": s.mean_jct_min / min(rows[p].mean_jct_min for p in CARMA),
        "p95_jct_ratio": s.p95_jct_min / min(rows[p].p95_jct_min for p in CARMA),
        "vs_exclusive": s.makespan_min / rows["exclusive"].makespan_min,
        "carma_makespan_min": {p: round(rows[p].makespan_min, 2) for p in CARMA},
        "carma_jct_min": {p: round(rows[p].mean_jct_min, 2) for p in CARMA},
        "carma_p95_jct_min": {p: round(rows[p].p95_jct_min, 2) for p in CARMA},
        "multi_gpu_wait_min": None if s.multi_gpu_wait_min is None else round(s.multi_gpu_wait_min, 1),
        "carma_lug_multi_gpu_wait_min": (None if rows["carma-lug"].multi_gpu_wait_min is None
                                         else round(rows["carma-lug"].multi_gpu_wait_min, 1)),
    }


def summary(rows: list[dict]) -> dict:
    def geo(key: str) -> float:
        return math.exp(sum(math.log(r[key]) for r in rows) / len(rows))

    return {"traces": len(rows), "makespan_geo": round(geo("makespan_ratio"), 4),
            "losses_over_1pct": sum(r["makespan_ratio"] > 1.01 for r in rows),
            "worst": round(max(r["makespan_ratio"] for r in rows), 4), "jct_geo": round(geo("jct_ratio"), 4),
            "jct_worse": sum(r["jct_ratio"] > 1.0 for r in rows),
            "p95_jct_geo": round(geo("p95_jct_ratio"), 4), "p95_jct_worse_over_1pct": sum(r["p95_jct_ratio"] > 1.01 for r in rows),
            "worse_than_exclusive": sum(r["vs_exclusive"] > 1.0 for r in rows),
            # the yardstick's own noise: how often each CARMA policy loses (> 1% in makespan) to
            # the best of the other three
            "carma_member_losses_over_1pct": member_losses(rows, "carma_makespan_min", 1.01),
            "carma_member_jct_worse": member_losses(rows, "carma_jct_min", 1.0),
            "carma_member_p95_jct_worse_over_1pct": member_losses(rows, "carma_p95_jct_min", 1.01)}


def member_losses(rows: list[dict], key: str, tolerance: float) -> dict[str, int]:
    """Per CARMA policy, on how many traces its ``key`` exceeds ``tolerance`` times the best of
    the other three: the bar "no worse than the best CARMA policy" set for each of them."""
    return {p: sum(r[key][p] > tolerance * min(v for q, v in r[key].items() if q != p) for r in rows)
            for p in CARMA}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--family", action="append", choices=(*FAMILIES, "grid-5000"))
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--model-error-seeds", type=int, default=0, metavar="N",
                    help="run every case under model-error seeds 1..N (docs/simulator.md) and compare "
                         "the policies' means; 0 (default): jobs run as the model predicts")
    ap.add_argument("--profiles", choices=PROFILE_KNOWLEDGE, default="trace",
                    help="what the policies know of jobs' activity (SimConfig.profiles): 'trace' "
                         "(default) tells them every profile, 'unknown' only what a fresh daemon "
                         "learns as the trace runs. Only `auto` reads profiles")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    auto = make_policy("auto", **parse_params(args.param))
    doc: dict = {"params": parse_params(args.param), "model_error_seeds": args.model_error_seeds,
                 "profiles": args.profiles, "families": {}}
    for name in args.family or FAMILIES:
        rows = [case(label, cluster, jobs, estimator, sharing, auto, args.model_error_seeds, args.profiles)
                for label, cluster, jobs, estimator in family(name, args.data) for sharing in ("time-slicing", "mps")]
        doc["families"][name] = {
            "summary": {sharing: summary([r for r in rows if r["sharing"] == sharing]) for sharing in ("time-slicing", "mps")},
            "cases": rows,
        }
        print(name, json.dumps(doc["families"][name]["summary"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
