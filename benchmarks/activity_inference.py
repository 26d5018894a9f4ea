"""How well a GPU's reading prices the jobs nobody has measured (issue 16, item 3).

For every mix of the H100 bench (2, 3 and 7 jobs sharing one GPU under time-slicing and MPS), the
summed solo SM activity of its jobs (what ``auto`` prices a GPU's load with) is estimated three
ways and compared with the truth from the jobs' solo runs:

* ``assumed``: the fixed first guess, 0.5 per job (``model.UNKNOWN_PROFILE``);
* ``reading``: the GPU's SM activity reading itself;
* ``inferred``: ``collocate.activity.infer_assumed``: the profile that makes the interference
  model read what the GPU read, with every job unmeasured.

Nothing is fitted here: the interference model is the packaged one (fitted to the same bench's
slowdowns, not to its readings). Run: ``python benchmarks/activity_inference.py``.
"""

from __future__ import annotations

import csv
import json
import statistics
from datetime import date
from pathlib import Path

from collocate.activity import infer_assumed
from collocate.interference import default_interference
from collocate.model import UNKNOWN_PROFILE, SharingMode

ROOT = Path(__file__).resolve().parent
BENCH = ROOT / "results" / "bench-h100-80gb-hbm3-2026-11-22" / "summary.csv"


def main() -> None:
    rows = list(csv.DictReader(BENCH.open()))
    solo = {r["workload"]: float(r["gpu_sm_activity"]) for r in rows if r["kind"] == "alone"}
    mixes: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r["kind"] != "alone" and r["status"] == "ok":
            mixes.setdefault((r["sharing"], r["scenario"]), []).append(r)
    model = default_interference()
    cases = []
    for (mode, scenario), members in sorted(mixes.items()):
        n = len(members)
        sm, dram = float(members[0]["gpu_sm_activity"]), float(members[0]["gpu_dram_activity"])
        guess = infer_assumed([], n, sm, dram, model.modes[SharingMode(mode)])
        cases.append({
            "mode": mode, "scenario": scenario, "jobs": n,
            "true": round(sum(solo[m["workload"]] for m in members), 4),
            "assumed": round(n * UNKNOWN_PROFILE.sm_activity, 4),
            "reading": round(sm, 4),
            "inferred": round(n * guess.sm_activity, 4) if guess else None,
        })
    summary = {}
    for mode in sorted({c["mode"] for c in cases}):
        mine = [c for c in cases if c["mode"] == mode]
        summary[mode] = {
            way: {
                "median_rel_error": round(statistics.median(abs(c[way] / c["true"] - 1) for c in mine), 3),
                "max_rel_error": round(max(abs(c[way] / c["true"] - 1) for c in mine), 3),
                "mean_signed_rel_error": round(statistics.mean(c[way] / c["true"] - 1 for c in mine), 3),
            }
            for way in ("assumed", "reading", "inferred")
        }
    out = ROOT / "results" / f"activity_inference-h100-bench-{date.today().isoformat()}"
    out.with_suffix(".json").write_text(json.dumps(
        {"source": str(BENCH.relative_to(ROOT.parent)), "machine": "2-core CPU dev machine (analysis only)",
         "summary": summary, "cases": cases}, indent=1) + "\n")
    lines = ["# Pricing unmeasured jobs from a GPU's reading (H100 bench mixes)", "",
             f"Source: `{BENCH.relative_to(ROOT.parent)}`; `benchmarks/activity_inference.py`.", "",
             "| mode | estimate | median rel. error | max | mean signed |", "|---|---|---:|---:|---:|"]
    for mode, ways in summary.items():
        for way, e in ways.items():
            lines.append(f"| {mode} | {way} | {e['median_rel_error']:.3f} | {e['max_rel_error']:.3f} "
                         f"| {e['mean_signed_rel_error']:+.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
