"""Compare our estimator and the two baselines with measured GPU peaks; write a markdown report.

Reads a CSV written by ``estimator_ground_truth.py`` (rows with status "ok"), runs
``estimate_memory`` (ours), the Horus formula and the plain FakeTensor peak on each
configuration, and reports against the NVML per-process peak (what other jobs on the GPU see):
median absolute percentage error, share of cases under-estimated by more than 10% (the ones that
cause out-of-memory crashes when collocating), and the worst cases. Issue #4's goal: median
error <= 10% and fewer than 5% of cases under-estimated by more than 10%.

    python benchmarks/gpu/estimator_report.py benchmarks/results/estimator_ground_truth-<date>.csv
        [--out docs/estimator-accuracy.md]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNDER_THRESHOLD = 0.10
GOAL_MEDIAN_APE = 0.10
GOAL_UNDER_SHARE = 0.05
ESTIMATORS = ("ours", "horus", "faketensor")


@dataclass
class Case:
    """One measured configuration with every estimator's answer (MiB; None = failed)."""

    config: str
    family: str
    actual_mib: float
    reserved_mib: float | None
    estimates: dict[str, float | None] = field(default_factory=dict)
    method: str = ""
    context_mib: float = 0.0


def ape(estimate: float, actual: float) -> float:
    """Absolute percentage error as a fraction."""
    return abs(estimate - actual) / actual


def summarise(cases: Sequence[Case], estimator: str) -> dict[str, Any]:
    """n, failures, median APE, share under-estimated by > 10%, worst APE, median ratio."""
    pairs = [(c.estimates.get(estimator), c.actual_mib) for c in cases]
    ok = [(e, a) for e, a in pairs if e is not None]
    if not ok:
        return {"n": 0, "failed": len(pairs)}
    errs = [ape(e, a) for e, a in ok]
    return {
        "n": len(ok),
        "failed": len(pairs) - len(ok),
        "median_ape": statistics.median(errs),
        "under_share": sum(e < (1 - UNDER_THRESHOLD) * a for e, a in ok) / len(ok),
        "max_ape": max(errs),
        "median_ratio": statistics.median(e / a for e, a in ok),
    }


def missing_package(row: dict[str, str]) -> str | None:
    """The optional model package a row's entry point needs and this machine lacks, if any
    (torchvision, timm and transformers models are estimated only where they are installed)."""
    import importlib.util

    from estimator_ground_truth import CONFIGS

    needs = {c.name: c.requires for c in CONFIGS}.get(row["config"])
    return needs if needs and importlib.util.find_spec(needs) is None else None


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("status") == "ok" and r.get("nvml_peak_mib")]


def build_cases(rows: Sequence[dict[str, str]], estimate: Callable[[dict[str, str]], dict[str, Any]]
                ) -> list[Case]:
    """Run ``estimate(row)`` (returns {"ours", "horus", "faketensor", "method", "context"})."""
    cases = []
    for r in rows:
        got = estimate(r)
        cases.append(Case(
            config=r["config"], family=r.get("family", ""), actual_mib=float(r["nvml_peak_mib"]),
            reserved_mib=float(r["max_reserved_mib"]) if r.get("max_reserved_mib") else None,
            estimates={k: got.get(k) for k in ESTIMATORS}, method=got.get("method", ""),
            context_mib=float(got.get("context", 0.0)),
        ))
    return cases


def run_estimators(row: dict[str, str]) -> dict[str, Any]:
    """The real estimators on one CSV row (our method, Horus, FakeTensor)."""
    from collocate.common.errors import CollocateError
    from collocate.estimate.api import estimate_baselines, estimate_memory
    from collocate.estimate.base import Estimate
    from collocate.estimate.gpu_overheads import gpu_type_from_device_name

    g = gpu_type_from_device_name(row.get("device_name", ""))
    out: dict[str, Any] = {}
    bs = int(row["batch_size"])
    try:
        est = estimate_memory(row["entry_point"], batch_size=bs, optimizer=row["optimizer"] or None,
                              precision=row["precision"], gpu=g.name if g else None,
                              allocator=row.get("allocator") or "default")
        out.update(ours=est.mib, method=est.method, context=est.breakdown.get("context", 0.0))
    except CollocateError as exc:
        out.update(ours=None, method=f"failed: {str(exc).splitlines()[0][:80]}")
    for name, b in estimate_baselines(row["entry_point"], batch_size=bs,
                                      precision=row["precision"]).items():
        out[name] = b.mib if isinstance(b, Estimate) else None
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _estimating_packages() -> str:
    """Versions of the packages whose code the estimates traced, as installed where this runs."""
    from importlib import metadata

    found = []
    for name in ("torch", "torchvision", "timm", "transformers"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def render(cases: Sequence[Case], meta: dict[str, str], source: str,
           skipped: Sequence[tuple[str, str]] = ()) -> str:
    """The markdown report; ``skipped`` are (config, package) measured but not estimated here."""
    lines = ["# Estimator accuracy", ""]
    if "FIXTURE" in meta.get("device_name", "").upper():
        lines += ["> **FIXTURE, NOT A MEASUREMENT.** This report was generated from a hand-made",
                  "> test CSV to exercise the report generator; its numbers mean nothing.", ""]
    lines += [
        f"Measured data: `{source}`; device {meta.get('device_name', '?')}, driver "
        f"{meta.get('driver', '?')}, CUDA {meta.get('cuda', '?')}, torch {meta.get('torch', '?')}, "
        f"measured {meta.get('date_utc', '?')}, PyTorch allocator "
        f"{meta.get('allocator') or 'default'}. Ground truth is the NVML per-process peak "
        "(includes the CUDA context). Generated by `benchmarks/gpu/estimator_report.py`.",
        "",
        f"Estimated with {_estimating_packages()}: model code that differs from the measured "
        "machine's can change a row.",
        "",
        "| estimator | cases | failed | median abs. error | under-estimated >10% | worst error "
        "| median est/actual |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    sums = {name: summarise(cases, name) for name in ESTIMATORS}
    for name, s in sums.items():
        if s["n"] == 0:
            lines.append(f"| {name} | 0 | {s['failed']} | - | - | - | - |")
            continue
        lines.append(f"| {name} | {s['n']} | {s['failed']} | {_pct(s['median_ape'])} | "
                     f"{_pct(s['under_share'])} | {_pct(s['max_ape'])} | {s['median_ratio']:.2f} |")
    if skipped:
        packages = sorted({p for _, p in skipped})
        lines += ["", f"Not estimated here ({len(skipped)} measured configurations, not in the "
                      f"table): {', '.join(packages)} not installed where this report was made: "
                      + ", ".join(f"`{c}`" for c, _ in skipped) + "."]
    ours = sums["ours"]
    if ours["n"]:
        met = ours["median_ape"] <= GOAL_MEDIAN_APE and ours["under_share"] < GOAL_UNDER_SHARE
        lines += ["", f"Goal (median error <= {_pct(GOAL_MEDIAN_APE)}, under "
                      f"{_pct(GOAL_UNDER_SHARE)} of cases under-estimated by more than "
                      f"{_pct(UNDER_THRESHOLD)}): **{'met' if met else 'not met'}**."]
    worst = sorted((c for c in cases if c.estimates.get("ours") is not None),
                   key=lambda c: ape(c.estimates["ours"] or 0.0, c.actual_mib), reverse=True)[:5]
    lines += ["", "## Worst cases (ours)", "", "| config | actual MiB | ours MiB | error | method |",
              "| --- | ---: | ---: | ---: | --- |"]
    for c in worst:
        e = c.estimates["ours"] or 0.0
        lines.append(f"| {c.config} | {c.actual_mib:,.0f} | {e:,.0f} | "
                     f"{100 * (e - c.actual_mib) / c.actual_mib:+.1f}% | {c.method} |")
    lines += ["", "## Every case", "",
              "| config | family | actual MiB | reserved MiB | ours | horus | faketensor |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in cases:
        cells = []
        for name in ESTIMATORS:
            e = c.estimates.get(name)
            cells.append("failed" if e is None else f"{e:,.0f} ({e / c.actual_mib:.2f}x)")
        res = f"{c.reserved_mib:,.0f}" if c.reserved_mib is not None else "-"
        lines.append(f"| {c.config} | {c.family} | {c.actual_mib:,.0f} | {res} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write docs/estimator-accuracy.md from measurements.")
    ap.add_argument("csv", type=Path)
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parents[2] / "docs" / "estimator-accuracy.md")
    args = ap.parse_args(argv)
    rows = read_rows(args.csv)
    if not rows:
        print(f"{args.csv}: no rows with status ok and an NVML peak", file=sys.stderr)
        return 1
    missing = {r["config"]: missing_package(r) for r in rows}
    skipped = [(c, pkg) for c, pkg in missing.items() if pkg]
    cases = build_cases([r for r in rows if not missing[r["config"]]], run_estimators)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(cases, rows[0], args.csv.name, skipped))
    print(f"wrote {args.out} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
