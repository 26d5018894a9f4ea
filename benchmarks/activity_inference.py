"""How well a GPU's reading prices the jobs on it (issues 16 and 29): real H100 mixes.

For every mix of the H100 bench (2, 3 and 7 jobs sharing one GPU under time-slicing and MPS), the
summed solo SM activity of its jobs (what ``auto`` prices a GPU's load with) is estimated three
ways and compared with the truth from the jobs' solo runs:

* ``assumed``: the prior alone, 0.5 per job (``model.UNKNOWN_PROFILE``);
* ``reading``: the GPU's SM activity reading itself;
* ``inferred``: ``collocate.core.belief.revise`` from the prior with every job unmeasured, by the
  mix's measured SM and DRAM readings (10 samples): what the world model prices such a GPU with.

And the case issue 29 is about, a newcomer beside jobs already known: for each job of each mix,
its SM activity as ``revise`` infers it from the prior, the others' solo profiles known, by the
mix's readings (``newcomer``), against the prior's 0.5.

Nothing is fitted here: the interference model is the packaged one (fitted to the same bench's
slowdowns, not to its readings). Run: ``python benchmarks/activity_inference.py``.
"""

from __future__ import annotations

import csv
import json
import statistics
from datetime import date
from pathlib import Path

from collocate.core.belief import UNKNOWN, exact, revise
from collocate.core.interference import default_interference
from collocate.core.model import UNKNOWN_PROFILE, JobProfile, SharingMode

ROOT = Path(__file__).resolve().parent
BENCH = ROOT / "results" / "bench-h100-80gb-hbm3-2026-11-22" / "summary.csv"


def main() -> None:
    rows = list(csv.DictReader(BENCH.open()))
    solo = {r["workload"]: JobProfile(float(r["gpu_sm_activity"]), float(r["gpu_dram_activity"]))
            for r in rows if r["kind"] == "alone"}
    mixes: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r["kind"] != "alone" and r["status"] == "ok":
            mixes.setdefault((r["sharing"], r["scenario"]), []).append(r)
    model = default_interference()
    cases, newcomers = [], []
    for (mode, scenario), members in sorted(mixes.items()):
        n = len(members)
        params = model.modes[SharingMode(mode)]
        sm, dram = float(members[0]["gpu_sm_activity"]), float(members[0]["gpu_dram_activity"])
        inferred = revise([UNKNOWN] * n, params, sm, dram, samples=10)
        cases.append({
            "mode": mode, "scenario": scenario, "jobs": n,
            "true": round(sum(solo[m["workload"]].sm_activity for m in members), 4),
            "assumed": round(n * UNKNOWN_PROFILE.sm_activity, 4),
            "reading": round(sm, 4),
            "inferred": round(sum(b.profile.sm_activity for b in inferred), 4),
        })
        for k, m in enumerate(members):  # the newcomer, the others known
            told = [UNKNOWN if j == k else exact(solo[o["workload"]]) for j, o in enumerate(members)]
            mine = revise(told, params, sm, dram, samples=10)[k]
            newcomers.append({"mode": mode, "scenario": scenario, "jobs": n, "workload": m["workload"],
                              "true": solo[m["workload"]].sm_activity,
                              "inferred": round(mine.profile.sm_activity, 4), "sd": round(mine.sm_sd, 4)})
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
        new = [c for c in newcomers if c["mode"] == mode]
        summary[mode]["newcomer"] = {
            "median_abs_error": round(statistics.median(abs(c["inferred"] - c["true"]) for c in new), 3),
            "prior_median_abs_error": round(statistics.median(abs(0.5 - c["true"]) for c in new), 3),
            "within_2_sd": round(sum(abs(c["inferred"] - c["true"]) <= 2 * c["sd"] for c in new) / len(new), 2),
            "cases": len(new)}
    out = ROOT / "results" / f"activity_inference-h100-bench-{date.today().isoformat()}"
    out.with_suffix(".json").write_text(json.dumps(
        {"source": str(BENCH.relative_to(ROOT.parent)), "machine": "2-core CPU dev machine (analysis only)",
         "summary": summary, "cases": cases, "newcomers": newcomers}, indent=1) + "\n")
    lines = ["# Pricing unmeasured jobs from a GPU's reading (H100 bench mixes)", "",
             f"Source: `{BENCH.relative_to(ROOT.parent)}`; `benchmarks/activity_inference.py`.", "",
             "| mode | estimate | median rel. error | max | mean signed |", "|---|---|---:|---:|---:|"]
    for mode, ways in summary.items():
        for way, e in ways.items():
            if way != "newcomer":
                lines.append(f"| {mode} | {way} | {e['median_rel_error']:.3f} | {e['max_rel_error']:.3f} "
                             f"| {e['mean_signed_rel_error']:+.3f} |")
    lines += ["", "A newcomer beside jobs whose solo profiles are known: its SM activity inferred from the "
              "mix's readings", "", "| mode | cases | median abs. error | the prior's (0.5) | within 2 sd |",
              "|---|---:|---:|---:|---:|"]
    for mode, ways in summary.items():
        n = ways["newcomer"]
        lines.append(f"| {mode} | {n['cases']} | {n['median_abs_error']:.3f} | {n['prior_median_abs_error']:.3f} "
                     f"| {n['within_2_sd']:.0%} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
