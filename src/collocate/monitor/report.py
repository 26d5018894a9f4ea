"""``collocate report``: per-user, per-job and per-GPU summaries with PNG plots.

Input is the monitoring store (``MonitorStore``) and, when given, the job store's accounting
(``accounting``: ``sacct``'s view of each job: state, exit code, GPUs, how long it waited and
ran, from ``daemon.views.job_rows``), so a report can be made while the daemon runs or after it
stopped, and a job that held no GPU memory (a CPU job on emulated GPUs) still shows its times
instead of a row of zeros. Without ``since`` the job and GPU numbers are whole-life totals
(never pruned); with ``since`` they are sums over the retained samples after it. Outputs in
``out``:

* ``summary.md`` (tables a human reads) and ``summary.json`` (the same numbers for tools);
* ``gpu_timeline.png``: one row per GPU, a bar per job while it held memory there
  (``gantt.draw_gantt``, which ``collocate simulate`` draws too);
* ``utilization.png``: SM activity (or NVML utilization) and memory of each GPU over time;
* ``energy.png``: power of each GPU over time, and energy per job (Wh; past 30 jobs the 29
  largest and one "others" bar).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from collocate.common.errors import InputError
from collocate.common.gantt import Bar, draw_gantt
from collocate.common.safetext import printable
from collocate.monitor.store import JobSummary, MonitorStore

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_PLOT_ROWS = 200_000
ENERGY_BARS = 30  # bars in energy.png; past it the smallest jobs share one 'others' bar


def parse_since(text: str, now: float | None = None) -> float:
    """``90m``/``24h``/``7d``, an ISO date-time (local time unless it has an offset), or epoch s."""
    now = time.time() if now is None else now
    match = _DURATION.match(text)
    if match:
        return now - float(match[1]) * _UNIT_S[match[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise InputError(f"cannot read --since {text!r}",
                         hint="use a duration like 24h or 7d, a date like 2026-11-20T08:00, "
                         "or seconds since the epoch") from None


#: Why a job shows no GPU figures: what ``show`` says instead of a bare 0.
NO_GPU_USE = ("not measured: no process of the job held GPU memory, so it was charged no GPU "
              "time or energy (on emulated GPUs only `collocate emulate-job` processes hold any)")


def summary_lines(s: JobSummary) -> list[str]:
    """The lines ``collocate show`` adds for a job's measured usage; a figure that was not
    measured says so and why, never a bare zero."""
    cpu = f"CPU-hours        {s.cpu_hours:.3f}, peak host memory {s.peak_rss_mib:,.0f} MiB"
    if s.occupancy_hours <= 0 and s.peak_mib <= 0:
        return [f"GPU              {NO_GPU_USE}", cpu]
    sm = ("not read (this GPU gives no SM activity)" if s.mean_sm is None
          else f"{100 * s.mean_sm:.0f}%")
    energy = (f"{s.energy_wh:.2f} Wh" if s.energy_wh > 0 else
              "not measured: its GPU gave no power reading (MIG instances and some boards have none)")
    return [
        f"peak GPU memory  {s.peak_mib:,.0f} MiB (any attempt)",
        f"mean SM activity {sm}",
        f"GPU-hours        {s.gpu_hours:.3f} (share of GPU time; held {s.occupancy_hours:.3f})",
        f"energy           {energy}",
        cpu,
    ]


@dataclass(frozen=True)
class Report:
    since: float | None
    jobs: list[JobSummary]
    users: list[dict[str, Any]]
    gpus: list[dict[str, Any]]
    files: list[Path]


def build_report(store: MonitorStore, out: Path, *, since: float | None = None,
                 accounting: list[dict[str, Any]] | None = None) -> Report:
    """Compute the summaries and write every file into ``out`` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = store.job_summaries(since=since)
    series = store.gpu_series(since=since or 0.0, limit=MAX_PLOT_ROWS)
    acct = [a for a in accounting or [] if since is None or (a.get("end_time") or time.time()) >= since]
    users = _per_user(jobs, acct)
    gpus = _per_gpu(store, series, since)
    files = [out / "summary.md", out / "summary.json"]
    files[0].write_text(_markdown(since, jobs, users, gpus, acct))
    files[1].write_text(json.dumps({"since": since, "jobs": [j.to_dict() for j in jobs],
                                    "accounting": acct, "users": users, "gpus": gpus}, indent=1))
    files += _plots(out, series, jobs)
    return Report(since, jobs, users, gpus, files)


def _per_user(jobs: list[JobSummary], acct: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per user: measured use (GPU-hours as a share of GPU time, energy, CPU) and, from the
    job store, jobs, GPUs held x wall time, and the mean wait before a job's first start."""
    users: dict[str, dict[str, Any]] = {}

    def row(user: str) -> dict[str, Any]:
        return users.setdefault(user or "?", {"user": user or "?", "jobs": 0, "gpu_hours": 0.0,
                                              "energy_wh": 0.0, "cpu_hours": 0.0,
                                              "held_gpu_hours": 0.0, "waits": []})
    for j in jobs:
        u = row(j.user)
        u["jobs"] += 0 if acct else 1
        u["gpu_hours"] += j.gpu_hours
        u["energy_wh"] += j.energy_wh
        u["cpu_hours"] += j.cpu_hours
    for a in acct:
        u = row(a["user"])
        u["jobs"] += 1
        u["held_gpu_hours"] += (a.get("elapsed_s") or 0.0) * a["gpus"] / 3600.0
        if a.get("start_time") is not None:
            u["waits"].append(a["wait_s"])
    for u in users.values():
        waits = u.pop("waits")
        u["mean_wait_s"] = sum(waits) / len(waits) if waits else None
    return sorted(users.values(), key=lambda u: (-u["energy_wh"], -u["held_gpu_hours"]))


def _per_gpu(store: MonitorStore, series: list[dict[str, Any]],
             since: float | None) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for r in series:
        g = rows.setdefault(r["uuid"], {"gpu": r["gpu"], "uuid": r["uuid"], "energy_wh": 0.0,
                                        "samples": 0, "sm_sum": 0.0, "sm_n": 0, "busy": 0,
                                        "jobs": set()})
        g["energy_wh"] += (r["energy_j"] or 0.0) / 3600.0
        g["samples"] += 1
        sm = r["sm"] if r["sm"] is not None else r["gpu_util"]
        if sm is not None:
            g["sm_sum"] += sm
            g["sm_n"] += 1
        g["busy"] += bool(r["jobs"])
        g["jobs"].update(r["jobs"])
    if since is None:  # whole-life energy from the totals, which retention never prunes
        for t in store.gpu_totals():
            g = rows.setdefault(t["uuid"], {"gpu": t["gpu"], "uuid": t["uuid"], "samples": 0,
                                            "sm_sum": 0.0, "sm_n": 0, "busy": 0, "jobs": set()})
            g["energy_wh"] = t["energy_j"] / 3600.0
            g["idle_wh"] = t["idle_energy_j"] / 3600.0
    out = []
    for g in sorted(rows.values(), key=lambda g: g["gpu"]):
        out.append({"gpu": g["gpu"], "uuid": g["uuid"], "energy_wh": g["energy_wh"],
                    "idle_wh": g.get("idle_wh"),
                    "mean_sm": g["sm_sum"] / g["sm_n"] if g["sm_n"] else None,
                    "busy_fraction": g["busy"] / g["samples"] if g["samples"] else None,
                    "jobs": sorted(g["jobs"], key=_job_key)})
    return out


def _markdown(since: float | None, jobs: list[JobSummary], users: list[dict[str, Any]],
              gpus: list[dict[str, Any]], acct: list[dict[str, Any]]) -> str:
    from collocate.common.units import format_duration

    span = ("whole history" if since is None
            else f"since {datetime.fromtimestamp(since):%Y-%m-%d %H:%M}")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    lines = [f"# collocate report ({span})", "", "## Per user", "",
             "| user | jobs | GPU-hours | energy (Wh) | CPU-hours | GPUs held x hours | mean wait |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {_cell(u['user'])} | {u['jobs']} | {u['gpu_hours']:.3f} | {u['energy_wh']:.2f} |"
              f" {u['cpu_hours']:.3f} | {u['held_gpu_hours']:.3f} | {format_duration(u['mean_wait_s'])} |"
              for u in users]
    measured = {j.job_id: j for j in jobs}
    lines += ["", "## Per job", "", "| job | user | name | state | exit | GPUs | waited | ran | peak MiB |"
              " mean SM | GPU-hours | energy (Wh) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = acct or [{"id": j.job_id, "user": j.user, "name": j.name, "state": "-", "exit_code": None,
                     "on": list(j.gpus), "wait_s": None, "elapsed_s": None} for j in jobs]
    for a in rows:
        j = measured.get(a["id"])
        code = a.get("exit_code")
        lines.append(
            f"| {_cell(a['id'])} | {_cell(a['user'])} | {_cell(a['name'])} | {a['state']} |"
            f" {'-' if code is None else code} | {_cell(', '.join(a.get('on') or [])) or '-'} |"
            f" {format_duration(a.get('wait_s'))} | {format_duration(a.get('elapsed_s'))} |"
            + (f" {j.peak_mib:,.0f} | {pct(j.mean_sm)} | {j.gpu_hours:.3f} | {j.energy_wh:.2f} |"
               if j is not None else " - | - | - | - |"))
    if acct and not any(j.peak_mib > 0 for j in jobs):
        lines += ["", "No job was seen holding GPU memory, so the measured columns are empty or zero: "
                  "on emulated GPUs, jobs that compute on the CPU (such as examples/train.py without "
                  "CUDA) claim none. Waits, run times and GPUs held come from the job store."]
    lines += ["", "## Per GPU", "", "| GPU | energy (Wh) | idle (Wh) | mean SM | busy | jobs |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {g['gpu']} | {g['energy_wh']:.2f} | "
              f"{'-' if g['idle_wh'] is None else format(g['idle_wh'], '.2f')} | "
              f"{pct(g['mean_sm'])} | {pct(g['busy_fraction'])} | {', '.join(g['jobs'])} |"
              for g in gpus]
    lines += ["", "Energy of shared GPUs is split among jobs as docs/monitoring.md describes.", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A user's text in a Markdown table: control characters escaped (``cat summary.md`` must
    not run them) and ``|`` kept from splitting the cell."""
    return printable(text).replace("|", "\\|")


def _plots(out: Path, series: list[dict[str, Any]], jobs: list[JobSummary]) -> list[Path]:
    from collocate.common.plotting import pyplot

    plt = pyplot()

    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for r in series:
        by_gpu.setdefault(r["gpu"], []).append(r)
    names = sorted(by_gpu)
    t0 = min((r["t"] for r in series), default=0.0)
    files = [out / "gpu_timeline.png", out / "utilization.png", out / "energy.png"]

    bars = [Bar(gpu, job, (start - t0) / 60, (end - t0) / 60)
             for gpu in names for job, (start, end) in _segments(by_gpu[gpu])]
    fig, ax = plt.subplots(figsize=(10, 1 + 0.5 * max(1, len(names))))
    draw_gantt(ax, bars, title="jobs on each GPU", xlabel="minutes")
    fig.tight_layout()
    fig.savefig(files[0], dpi=100)
    plt.close(fig)

    fig, (sm_ax, mem_ax) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for gpu in names:
        rows = by_gpu[gpu]
        xs = [(r["t"] - t0) / 60 for r in rows]
        sm_ax.plot(xs, [r["sm"] if r["sm"] is not None else r["gpu_util"] for r in rows], label=gpu)
        mem_ax.plot(xs, [(r["used_mib"] or 0) / 1024 for r in rows], label=gpu)
    sm_ax.set_ylabel("SM activity")
    mem_ax.set_ylabel("memory used (GiB)")
    mem_ax.set_xlabel("minutes")
    if names:
        sm_ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(files[1], dpi=100)
    plt.close(fig)

    fig, (p_ax, e_ax) = plt.subplots(2, 1, figsize=(10, 6))
    for gpu in names:
        rows = by_gpu[gpu]
        p_ax.plot([(r["t"] - t0) / 60 for r in rows], [r["power_w"] for r in rows], label=gpu)
    p_ax.set_ylabel("power (W)")
    p_ax.set_xlabel("minutes")
    labels, values = energy_bars(jobs)
    e_ax.bar(labels, values)
    e_ax.set_ylabel("energy (Wh)")
    e_ax.set_xlabel("job")
    shown = f"the {ENERGY_BARS - 1} largest of {len(jobs)}, the rest as 'others'"
    e_ax.set_title(f"energy per job ({shown if len(labels) < len(jobs) else 'all jobs'})")
    fig.tight_layout()
    fig.savefig(files[2], dpi=100)
    plt.close(fig)
    return files


def _segments(rows: list[dict[str, Any]]) -> list[tuple[str, tuple[float, float]]]:
    """(job, (start, end)) for each stretch of consecutive samples a job was on the GPU."""
    open_at: dict[str, float] = {}
    out = []
    last_t = rows[0]["t"] if rows else 0.0
    for r in rows:
        for job in [j for j in open_at if j not in r["jobs"]]:
            out.append((job, (open_at.pop(job), last_t)))
        for job in r["jobs"]:
            open_at.setdefault(job, r["t"])
        last_t = r["t"]
    out += [(job, (start, last_t)) for job, start in open_at.items()]
    return out


def energy_bars(jobs: list[JobSummary]) -> tuple[list[str], list[float]]:
    """Every job's energy, or, past ``ENERGY_BARS`` jobs, the largest ones and one 'others'
    bar with the rest (so the total the bars show is always the whole)."""
    ranked = sorted(jobs, key=lambda j: -j.energy_wh)
    if len(ranked) <= ENERGY_BARS:
        return [j.job_id for j in ranked], [j.energy_wh for j in ranked]
    top, rest = ranked[:ENERGY_BARS - 1], ranked[ENERGY_BARS - 1:]
    return ([j.job_id for j in top] + ["others"],
            [j.energy_wh for j in top] + [sum(j.energy_wh for j in rest)])


def _job_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (0, job_id)
