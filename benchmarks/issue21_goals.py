"""Issue 21's goals, case by case, on the issue's own scope: met or not, with the numbers.

    PYTHONPATH=src python benchmarks/issue21_goals.py [--data ../shared/data] [--sizes 600,5000]
        [--model-error-seeds N] [--out FILE]

The scope is the issue's: carma-heavy-60 and carma-mix-90 on 4xA100-40GB with the estimators
peak, horus, faketensor and gpumemnet, and the synthetic grid (600 and 5,000 jobs, 8xA100-40GB
and 2x(8xH100-80GB), loads 0.6, 0.9 and 1.2, seed 3), each under time-slicing and MPS. The
goals, for `auto`:

* ``gap``: it closes at least 60% (time-slicing) / 75% (MPS) of the gap between exclusive's
  makespan and the model floor (``collocate.sim.floor``; not computed for 5,000 jobs, where it
  takes minutes per case);
* ``exclusive``: its makespan is no longer than exclusive's;
* ``carma``: its makespan is within 1% of the best CARMA-family policy's;
* ``mean_jct`` / ``p95_jct``: no longer than any other policy's that failed no job;
* ``multi_gpu_wait``: its multi-GPU jobs' mean wait is at most twice carma-lug's.

Each CARMA policy is judged by the same bars in `auto`'s place (``goals_met``), so the summary
also says how many cases each of them would meet: how hard each bar is.

With ``--model-error-seeds N`` every policy runs each case under model-error seeds 1..N and the
goals are judged on the means (``benchmarks/auto_family.py`` explains why). Deterministic, CPU
only; prints a summary and writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine
from auto_family import CARMA, outcome, synthetic
from rich.progress import track

from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import POLICY_NAMES, make_policy
from collocate.sim.engine import SimConfig
from collocate.sim.floor import floors, gap_closed
from collocate.sim.trace import load_catalogue, load_trace

ESTIMATORS = ("peak", "horus", "faketensor", "gpumemnet")
GAP_GOAL = {SharingMode.TIME_SLICING: 0.60, SharingMode.MPS: 0.75}
GOALS = ("gap", "exclusive", "carma", "mean_jct", "p95_jct", "multi_gpu_wait")


def cases(data: Path, sizes: list[int]):
    """(label, cluster, jobs, estimator, floors wanted) of each trace in the issue's scope."""
    catalogue = load_catalogue(data / "carma-workloads.csv")
    for trace in ("carma-heavy-60", "carma-mix-90"):
        jobs = load_trace(data / f"{trace}.csv", catalogue)
        for estimator in ESTIMATORS:
            yield f"{trace} {estimator}", "4xA100-40GB", jobs, estimator, True
    for n in sizes:
        for cluster in ("8xA100-40GB", "2x(8xH100-80GB)"):
            for load in (0.6, 0.9, 1.2):
                yield (f"{n} jobs {cluster} load {load}", cluster, synthetic(n, cluster, 3, load), "peak",
                       n <= 600)


def goals_met(candidate: str, runs: dict, floor_s: float | None, sharing: SharingMode) -> dict:
    """The goals, judged for ``candidate`` against the other policies: for `auto` the issue's
    own; for a CARMA policy the same bars, so a scorecard shows how hard each bar is ("within 1%
    of the best CARMA policy" is then the best of the other three; multi-GPU waits are not judged
    for carma-lug itself)."""
    me, exclusive, lug = runs[candidate], runs["exclusive"], runs["carma-lug"]
    best_carma = min(runs[p].makespan_min for p in CARMA if p != candidate)
    clean = [o for p, o in runs.items() if p != candidate and o.failed == 0]
    gap = None if floor_s is None else gap_closed(me.makespan_min, exclusive.makespan_min, floor_s / 60)
    return {
        "gap": None if gap is None else gap >= GAP_GOAL[sharing],
        "exclusive": me.makespan_min <= exclusive.makespan_min,
        "carma": me.makespan_min <= 1.01 * best_carma,
        "mean_jct": me.mean_jct_min <= min(o.mean_jct_min for o in clean),
        "p95_jct": me.p95_jct_min <= min(o.p95_jct_min for o in clean),
        "multi_gpu_wait": (None if candidate == "carma-lug" or me.multi_gpu_wait_min is None
                           or not lug.multi_gpu_wait_min else me.multi_gpu_wait_min <= 2 * lug.multi_gpu_wait_min),
    }


def judge(label, cluster, jobs, estimator, floor_s, sharing: SharingMode, error_seeds: int) -> dict:
    nodes = parse_cluster(cluster)
    config = SimConfig(sharing=sharing, estimator=estimator)
    configs = [replace(config, model_error_seed=s) for s in range(1, error_seeds + 1)] or [config]
    runs = {p: outcome(nodes, jobs, make_policy(p), configs) for p in POLICY_NAMES}
    auto, exclusive, lug = runs["auto"], runs["exclusive"], runs["carma-lug"]
    best_carma = min(runs[p].makespan_min for p in CARMA)
    clean = [o for p, o in runs.items() if p != "auto" and o.failed == 0]
    gap = None if floor_s is None else gap_closed(auto.makespan_min, exclusive.makespan_min, floor_s / 60)
    return {
        "case": label, "cluster": cluster, "sharing": sharing.value, "met": goals_met("auto", runs, floor_s, sharing),
        "met_by_carma_policies": {p: goals_met(p, runs, floor_s, sharing) for p in CARMA},
        "auto": auto.__dict__, "exclusive_makespan_min": exclusive.makespan_min,
        "best_carma_makespan_min": best_carma, "gap_closed": gap,
        "model_floor_min": None if floor_s is None else floor_s / 60,
        "best_clean_mean_jct_min": min(o.mean_jct_min for o in clean),
        "best_clean_p95_jct_min": min(o.p95_jct_min for o in clean),
        "carma_lug_multi_gpu_wait_min": lug.multi_gpu_wait_min,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--sizes", default="600,5000", help="synthetic trace sizes, comma-separated")
    ap.add_argument("--model-error-seeds", type=int, default=0, metavar="N")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    todo = [(c, mode) for c in cases(args.data, [int(s) for s in args.sizes.split(",")])
            for mode in (SharingMode.TIME_SLICING, SharingMode.MPS)]
    floor_cache: dict[tuple[str, str], float] = {}
    rows = []
    for (label, cluster, jobs, estimator, want_floor), mode in track(todo, description="judging"):
        floor_s = None
        if want_floor:
            key = (label.split(" ")[0] if label.startswith("carma") else label, mode.value)
            if key not in floor_cache:
                f = floors(jobs, parse_cluster(cluster), mode)
                floor_cache[key] = f.model_floor_s
            floor_s = floor_cache[key]
        rows.append(judge(label, cluster, jobs, estimator, floor_s, mode, args.model_error_seeds))
    summary = {}
    for mode in ("time-slicing", "mps"):
        mine = [r for r in rows if r["sharing"] == mode]
        summary[mode] = {g: {"met": sum(r["met"][g] is True for r in mine),
                             "judged": sum(r["met"][g] is not None for r in mine),
                             "missed": [r["case"] for r in mine if r["met"][g] is False],
                             # the same bar for each CARMA policy in auto's place: met / judged
                             "carma_policies": {p: [sum(r["met_by_carma_policies"][p][g] is True for r in mine),
                                                    sum(r["met_by_carma_policies"][p][g] is not None for r in mine)]
                                                for p in CARMA}}
                         for g in GOALS}
    for mode, goals in summary.items():
        print(mode)
        for g, s in goals.items():
            others = ", ".join(f"{p} {m}/{n}" for p, (m, n) in s["carma_policies"].items())
            print(f"  {g:15s} {s['met']:2d}/{s['judged']:2d}  missed: {', '.join(s['missed']) or '-'}  ({others})")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "model_error_seeds": args.model_error_seeds,
                                        "summary": summary, "cases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
