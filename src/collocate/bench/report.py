"""Turn scenario records into a CSV summary, a markdown table and PNG plots.

Pure functions of the records (``results.jsonl``), so ``collocate bench report`` can rebuild
them after several resumed runs, and so the same numbers feed the calibration. Each file names
the device, driver, CUDA and torch versions and the date; CPU runs say they are not GPU numbers.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collocate.bench.envinfo import CPU_NOTE
from collocate.bench.plan import ALONE

ENV_FIELDS = ("device_name", "driver", "cuda", "torch", "date_utc", "measured_on")
CSV_FIELDS = (
    "scenario", "kind", "sharing", "copies", "status", "workload", "samples_per_s",
    "solo_samples_per_s", "slowdown", "time_per_epoch_s", "step_ms_p50", "step_ms_p99",
    "torch_reserved_mib", "nvml_process_mib", "gpu_sm_activity", "gpu_sm_occupancy",
    "gpu_dram_activity", "gpu_util", "gpu_power_w", "gpu_energy_j", "gpu_used_mib_max",
    *ENV_FIELDS,
)


def env_of(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The provenance block of the newest record (all records of one folder share a device)."""
    for r in reversed(records):
        if r.get("env"):
            return r["env"]
    return {}


def solo_rates(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """samples/s of each workload alone on the GPU."""
    out: dict[str, float] = {}
    for r in records:
        if r.get("sharing") == ALONE and r.get("status") == "ok" and r.get("jobs"):
            rate = r["jobs"][0].get("samples_per_s")
            if rate:
                out[r["workloads"][0]] = float(rate)
    return out


def job_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job of every scenario (the CSV), with its slowdown against its solo rate."""
    solo = solo_rates(records)
    rows = []
    for r in records:
        if r.get("kind") == "idle":
            continue
        gpu, env = r.get("gpu", {}), r.get("env", {})
        procs = gpu.get("process_mem_mib", {})
        base = {"scenario": r["scenario"], "kind": r["kind"], "sharing": r["sharing"],
                "copies": r["copies"], "status": r["status"],
                "gpu_sm_activity": gpu.get("sm_activity"),
                "gpu_sm_occupancy": gpu.get("sm_occupancy"),
                "gpu_dram_activity": gpu.get("dram_activity"), "gpu_util": gpu.get("gpu_util"),
                "gpu_power_w": gpu.get("power_watts"), "gpu_energy_j": gpu.get("energy_joules"),
                "gpu_used_mib_max": gpu.get("used_mib_max"),
                **{k: env.get(k) for k in ENV_FIELDS}}
        if not r.get("jobs"):
            rows += [{**base, "workload": w} for w in r["workloads"]]
            continue
        for job in r["jobs"]:
            rate = job.get("samples_per_s")
            alone = solo.get(job["workload"])
            rows.append({
                **base, "workload": job["workload"], "samples_per_s": rate,
                "solo_samples_per_s": alone,
                "slowdown": alone / rate if rate and alone else None,
                "time_per_epoch_s": job.get("time_per_epoch_s"),
                "step_ms_p50": (job.get("step_ms") or {}).get("p50"),
                "step_ms_p99": (job.get("step_ms") or {}).get("p99"),
                "torch_reserved_mib": job.get("max_memory_reserved_mib"),
                "nvml_process_mib": procs.get(str(job.get("pid"))),
            })
    return rows


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in CSV_FIELDS})
    return path


def _cell(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def _gib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1024:.1f}"


def _body(scenario_id: str) -> str:
    return scenario_id.split(":", 1)[1]


def header_lines(env: dict[str, Any]) -> list[str]:
    lines = [f"- device: {env.get('device_name', 'unknown')} (measured on {env.get('measured_on')})",
             f"- driver {env.get('driver') or 'n/a'}, CUDA {env.get('cuda') or 'n/a'}, "
             f"torch {env.get('torch')}, date {env.get('date_utc')}"]
    if env.get("measured_on") == "cpu":
        lines.append(f"- **{CPU_NOTE}**; the GPU columns come from an emulated GPU backend and "
                     "carry no information")
    elif env.get("measured_on") != "cuda":
        lines.append(f"- **measured on {env.get('measured_on')!r}: these are NOT GPU "
                     "measurements**")
    return lines


def markdown(records: Sequence[dict[str, Any]], source: str = "results.jsonl") -> str:
    """The "alone / time-slicing / MPS" table: time per epoch per job, SM activity, memory."""
    env = env_of(records)
    rows = job_rows(records)
    by_body: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    for row in rows:
        body = _body(row["scenario"])
        if body not in order:
            order.append(body)
        by_body[body][row["sharing"]].append(row)
    solo = {r["workload"]: r for r in rows if r["sharing"] == ALONE and r["status"] == "ok"}

    def alone(names: list[str], key: str, fmt) -> str:
        return " / ".join(fmt(solo[n].get(key)) if n in solo else "n/a" for n in names)

    out = ["# Collocation benchmark", "", *header_lines(env), f"- source: `{source}`", "",
           "Time per epoch is per job, from its samples/s and a nominal epoch size (synthetic "
           "data, no input pipeline). SM activity is the GPU's (GPM SM_UTIL) over the window in "
           "which all jobs were measuring; memory is the GPU's peak used memory in GiB.", "",
           "| scenario | time/epoch alone | time-slicing | MPS | SM act. alone | TS | MPS "
           "| mem alone | TS | MPS | slowdown TS | MPS |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for body in order:
        modes = by_body[body]
        names = list(dict.fromkeys(r["workload"] for m in modes.values() for r in m))

        def cell(mode: str, what: str, modes: dict = modes, names: list = names) -> str:
            group = modes.get(mode, [])
            if not group:
                return "-"
            if group[0]["status"] not in ("ok",):
                return group[0]["status"]
            if what == "epoch":
                per: dict[str, list[float]] = defaultdict(list)
                for r in group:
                    if r.get("time_per_epoch_s"):
                        per[r["workload"]].append(r["time_per_epoch_s"])
                return " / ".join(duration(sum(v) / len(v)) if (v := per.get(n)) else "n/a"
                                  for n in names)
            if what == "sm":
                return _pct(group[0]["gpu_sm_activity"])
            if what == "mem":
                return _gib(group[0]["gpu_used_mib_max"])
            slow = [r["slowdown"] for r in group if r.get("slowdown")]
            return f"{sum(slow) / len(slow):.2f}x" if slow else "n/a"

        out.append("| " + " | ".join([
            body, alone(names, "time_per_epoch_s", duration),
            cell("time-slicing", "epoch"), cell("mps", "epoch"),
            alone(names, "gpu_sm_activity", _pct), cell("time-slicing", "sm"), cell("mps", "sm"),
            alone(names, "gpu_used_mib_max", _gib), cell("time-slicing", "mem"),
            cell("mps", "mem"),
            cell("time-slicing", "slow"), cell("mps", "slow"),
        ]) + " |")
    out += ["", "Power and energy over each scenario's measurement window (energy from the "
            "NVML counter; per 1,000 samples of all its jobs together):", "",
            "| scenario | sharing | mean power (W) | energy (J) | window (s) | J per 1k samples |",
            "|---|---|---:|---:|---:|---:|"]
    for r in records:
        gpu = r.get("gpu") or {}
        if r.get("status") != "ok" or gpu.get("power_watts") is None:
            continue
        rate = sum(j.get("samples_per_s") or 0.0 for j in r.get("jobs", []))
        energy, window = gpu.get("energy_joules"), gpu.get("window_s")
        per_k = (f"{1000 * energy / (rate * window):.1f}" if energy and rate and window else "n/a")
        out.append(f"| {r['scenario'].split(':', 1)[-1]} | {r['sharing']} | "
                   f"{gpu['power_watts']:.0f} | {'n/a' if energy is None else f'{energy:.0f}'} | "
                   f"{'n/a' if window is None else f'{window:.1f}'} | {per_k} |")
    skipped = [r for r in records if r.get("status") == "skipped"]
    if skipped:
        out += ["", "Skipped scenarios:", *[f"- {r['scenario']}: {r['reason']}" for r in skipped]]
    failed = [r for r in records if r.get("status") in ("failed", "oom")]
    if failed:
        out += ["", "Failed scenarios:",
                *[f"- {r['scenario']}: {r['status']} {r.get('reason', '')}" for r in failed]]
    return "\n".join(out) + "\n"


def write_plots(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """slowdown.png (per job, TS vs MPS) and scaling.png (aggregate throughput vs copies)."""
    from collocate.common.plotting import pyplot

    plt = pyplot()

    env = env_of(records)
    subtitle = (f"{env.get('device_name')} · driver {env.get('driver') or 'n/a'} · CUDA "
                f"{env.get('cuda') or 'n/a'} · torch {env.get('torch')} · {env.get('date_utc')}")
    if env.get("measured_on") == "cpu":
        subtitle += "\nCPU RUN, TINY MODELS: NOT GPU MEASUREMENTS"
    elif env.get("measured_on") != "cuda":
        subtitle += f"\n{str(env.get('measured_on')).upper()} DATA: NOT GPU MEASUREMENTS"
    rows = [r for r in job_rows(records) if r["kind"] != "alone" and r.get("slowdown")]
    written: list[Path] = []

    bodies = list(dict.fromkeys(_body(r["scenario"]) for r in rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(bodies) + 3), 4.5))
    for offset, mode in ((-0.2, "time-slicing"), (0.2, "mps")):
        xs, ys = [], []
        for i, body in enumerate(bodies):
            vals = [r["slowdown"] for r in rows if r["sharing"] == mode and _body(r["scenario"]) == body]
            xs += [i + offset] * len(vals)
            ys += vals
        ax.scatter(xs, ys, label=mode, s=18)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(bodies)), bodies, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("per-job slowdown vs alone")
    ax.set_title(f"Collocation slowdown\n{subtitle}", fontsize=8)
    ax.legend(fontsize=8)
    written.append(out_dir / "slowdown.png")
    fig.savefig(written[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)

    solo = solo_rates(records)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for mode, style in (("time-slicing", "-o"), ("mps", "--s")):
        series: dict[str, dict[int, float]] = defaultdict(dict)
        for r in records:
            if r.get("kind") != "copies" or r.get("sharing") != mode or r.get("status") != "ok":
                continue
            name = r["workloads"][0]
            total = sum(j.get("samples_per_s") or 0.0 for j in r["jobs"])
            if solo.get(name):
                series[name][r["copies"]] = total / solo[name]
        for name, points in sorted(series.items()):
            ks = sorted(points)
            ax.plot([1, *ks], [1.0, *[points[k] for k in ks]], style, label=f"{name} ({mode})",
                    ms=4)
    ax.set_xlabel("copies on one GPU")
    ax.set_ylabel("aggregate throughput / alone")
    ax.set_title(f"Scaling with copies\n{subtitle}", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    written.append(out_dir / "scaling.png")
    fig.savefig(written[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return written


def write_all(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """summary.csv, table.md and the plots in ``out_dir``."""
    paths = [write_csv(job_rows(records), out_dir / "summary.csv")]
    (out_dir / "table.md").write_text(markdown(records))
    paths.append(out_dir / "table.md")
    return paths + write_plots(records, out_dir)
