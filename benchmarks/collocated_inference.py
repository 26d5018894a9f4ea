"""Can a job's solo activity be read while it shares a GPU? An offline check on the H100 bench.

The daemon learns a job's solo SM/DRAM activity only while the job is alone on its GPU
(``collocate.activity``), so on a busy cluster most jobs are never learned. Where every
neighbour's profile is already known, the GPU's own reading could be inverted instead: the
interference model says a GPU shared by jobs j reads ``Σ a_j / s_j`` (SM) and ``Σ d_j / s_j``
(DRAM), with ``s_j`` each job's slowdown given all profiles (on the H100 that matched GPM within
0.035 SM on average). With one job unknown, two readings give its two numbers.

This script tries it on every shared scenario of the round-A bench (2 jobs mixed or copied,
3 and 7 copies, time-slicing and MPS): one job is taken as unknown, the others as known from
their solo scenarios, and its profile is inferred from the scenario's measured GPU SM and DRAM
activity (grid search over [0, 1]², step 0.05, refined to 0.005 around the best point). It is compared with the job's measured solo
profile, beside two guesses the daemon could make without the model: the default 0.5 / 0.2,
and the GPU's reading split equally among the jobs.

The packaged interference model was calibrated on these same scenarios' slowdowns, so this is
an in-sample check of the inversion, not a validation of the model.

    python benchmarks/collocated_inference.py [--bench benchmarks/results/bench-h100-80gb-hbm3-2026-11-22]

Writes benchmarks/results/collocated_inference-<bench name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from collocate.core.interference import default_interference
from collocate.core.model import UNKNOWN_PROFILE, JobProfile, SharingMode

COARSE, FINE = 0.05, 0.005


def solo_profiles(records: list[dict]) -> dict[str, JobProfile]:
    return {r["workloads"][0]: JobProfile(r["gpu"]["sm_activity"], r["gpu"]["dram_activity"])
            for r in records if r["kind"] == "alone" and r["status"] == "ok"}


def predicted(model, mode: SharingMode, jobs: list[JobProfile]) -> tuple[float, float]:
    """The GPU's SM and DRAM readings the model predicts for these jobs sharing it."""
    sm = dram = 0.0
    for i, job in enumerate(jobs):
        s = model.slowdown(mode, job, jobs[:i] + jobs[i + 1:])
        sm, dram = sm + job.sm_activity / s, dram + job.dram_activity / s
    return min(1.0, sm), min(1.0, dram)


def infer(model, mode: SharingMode, known: list[JobProfile], sm: float, dram: float) -> JobProfile:
    """The unknown job's solo profile whose predicted readings come closest to the measured."""
    def search(sms, drams) -> JobProfile:
        best, best_err = UNKNOWN_PROFILE, float("inf")
        for a in sms:
            for d in drams:
                guess = JobProfile(round(float(a), 4), round(float(d), 4))
                p_sm, p_dram = predicted(model, mode, [guess, *known])
                err = (p_sm - sm) ** 2 + (p_dram - dram) ** 2
                if err < best_err:
                    best, best_err = guess, err
        return best

    def around(x: float):
        return np.clip(np.arange(x - COARSE, x + COARSE + 1e-9, FINE), 0.0, 1.0)

    coarse = search(np.arange(0.0, 1.0 + 1e-9, COARSE), np.arange(0.0, 1.0 + 1e-9, COARSE))
    return search(around(coarse.sm_activity), around(coarse.dram_activity))


def run(bench: Path) -> list[dict]:
    records = [json.loads(line) for line in (bench / "results.jsonl").read_text().splitlines()]
    solo = solo_profiles(records)
    model = default_interference()
    rows = []
    for r in records:
        if r["kind"] not in ("mix", "copies") or r["status"] != "ok":
            continue
        mode = SharingMode(r["sharing"])
        names = r["workloads"]
        sm, dram = r["gpu"]["sm_activity"], r["gpu"]["dram_activity"]
        for unknown in sorted(set(names)):
            rest = list(names)
            rest.remove(unknown)
            truth = solo[unknown]
            got = infer(model, mode, [solo[n] for n in rest], sm, dram)
            share = JobProfile(sm / len(names), dram / len(names))
            rows.append({"scenario": r["scenario"], "sharing": mode.value, "jobs": len(names),
                         "unknown": unknown, "solo_sm": round(truth.sm_activity, 3),
                         "solo_dram": round(truth.dram_activity, 3),
                         "inferred_sm": got.sm_activity, "inferred_dram": got.dram_activity,
                         "share_sm": round(share.sm_activity, 3),
                         "share_dram": round(share.dram_activity, 3)})
    return rows


def errors(rows: list[dict], key: str) -> dict[str, float]:
    """Median and 90th-percentile absolute SM and DRAM errors of one guess (or the default)."""
    def err(r: dict, what: str) -> float:
        guess = {"sm": UNKNOWN_PROFILE.sm_activity, "dram": UNKNOWN_PROFILE.dram_activity}[what] \
            if key == "default" else r[f"{key}_{what}"]
        return abs(guess - r[f"solo_{what}"])

    out = {}
    for what in ("sm", "dram"):
        e = sorted(err(r, what) for r in rows)
        out[f"{what}_median"] = round(statistics.median(e), 3)
        out[f"{what}_p90"] = round(e[int(0.9 * (len(e) - 1))], 3)
    return out


def markdown(rows: list[dict], bench: str) -> str:
    lines = [f"# Inferring a job's solo activity while it shares a GPU ({bench})", "",
             "`python benchmarks/collocated_inference.py`: one job of each shared bench scenario "
             "taken as unknown, its neighbours' solo profiles as known; the interference model "
             "inverted on the scenario's measured GPU SM and DRAM activity. In-sample: the model "
             "was calibrated on these scenarios. Absolute errors against the job's measured solo "
             "profile:", "",
             "| group | cases | guess | SM median | SM p90 | DRAM median | DRAM p90 |",
             "|---|---:|---|---:|---:|---:|---:|"]
    groups = {"all": rows}
    for mode in ("time-slicing", "mps"):
        groups[mode] = [r for r in rows if r["sharing"] == mode]
    groups["2 jobs"] = [r for r in rows if r["jobs"] == 2]
    groups["3 or 7 jobs"] = [r for r in rows if r["jobs"] > 2]
    for name, group in groups.items():
        for key, label in (("inferred", "model inverted"), ("share", "equal share"),
                           ("default", "default 0.5 / 0.2")):
            e = errors(group, key)
            lines.append(f"| {name} | {len(group)} | {label} | {e['sm_median']:.3f} | {e['sm_p90']:.3f} "
                         f"| {e['dram_median']:.3f} | {e['dram_p90']:.3f} |")
    lines += ["", "| scenario | unknown | solo SM | inferred SM | share SM | solo DRAM | inferred DRAM |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['unknown']} | {r['solo_sm']:.3f} | {r['inferred_sm']:.3f} "
                     f"| {r['share_sm']:.3f} | {r['solo_dram']:.3f} | {r['inferred_dram']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, default=Path(__file__).parent / "results"
                        / "bench-h100-80gb-hbm3-2026-11-22", help="a `collocate bench run` folder")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if not (args.bench / "results.jsonl").is_file():
        parser.error(f"no results.jsonl in {args.bench}")
    rows = run(args.bench)
    stem = args.out / f"collocated_inference-{args.bench.name}"
    stem.with_suffix(".json").write_text(json.dumps({"bench": args.bench.name, "rows": rows}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(rows, args.bench.name))
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
