"""Writing a comparison: the terminal tables (fitting 80 columns), the JSON document, per-job CSV and PNG plots
(a JCT CDF, and per policy a Gantt chart drawn by ``collocate.common.gantt``, as ``collocate report``)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from collocate.common.gantt import Bar, draw_gantt, natural
from collocate.sim.engine import SimResult
from collocate.sim.metrics import Summary, VersusExclusive

MAX_GANTT_GPUS = 32  # rows in a Gantt chart; the title says when there are more GPUs

#: The comparison in two tables of (summary key, header), each fitting an 80-column terminal
#: beside the longest policy name: one of times, one of use and failures.
TIME_COLUMNS = (
    ("makespan_min", "makespan"),
    ("mean_jct_min", "JCT mean"),
    ("median_jct_min", "JCT p50"),
    ("p95_jct_min", "JCT p95"),
    ("mean_wait_min", "wait"),
)
USE_COLUMNS = (
    ("sm_util", "SM"),
    ("mem_util", "mem"),
    ("energy_kwh", "kWh"),
    ("oom_crashes", "OOM crashes"),
    ("recovered_jobs", "recovered"),
    ("failed", "failed"),
    ("rejected", "rejected"),
)


def tables(summaries: Sequence[Summary]) -> list[Table]:
    """The policies side by side: times in minutes, then how much of the GPUs they used and
    what failed. Two narrow tables rather than one of 13 columns, which needs ~110."""
    return [_table("times (minutes)", summaries, TIME_COLUMNS),
            _table("use and failures", summaries, USE_COLUMNS)]


def _table(title: str, summaries: Sequence[Summary], columns: Sequence[tuple[str, str]]) -> Table:
    out = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False,
                padding=(0, 2, 0, 0))
    out.add_column("policy", no_wrap=True)
    for _, header in columns:
        out.add_column(header, justify="right", no_wrap=True)
    for s in summaries:
        row = s.as_dict()
        out.add_row(s.policy, *(_fmt(row[key]) for key, _ in columns))
    return out


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value < 1 else f"{value:.1f}"
    return str(value)


def versus_table(versus: dict[str, VersusExclusive]) -> Table:
    """Per policy, each job's completion time over its completion time under ``exclusive``."""
    out = Table(title="job by job against exclusive", title_justify="left", box=None, header_style="bold",
                pad_edge=False, padding=(0, 2, 0, 0))
    for header in ("policy", "jobs", "p50", "p95", "max", "worse", "not done"):
        out.add_column(header, justify="left" if header == "policy" else "right", no_wrap=True)
    for name, v in versus.items():
        out.add_row(name, str(v.jobs), f"{v.p50:.2f}", f"{v.p95:.2f}", f"{v.max:.2f}", str(v.worse),
                    str(v.not_done))
    return out


def legend(versus: dict[str, VersusExclusive]) -> str:
    """What the tables' figures are, printed under them (wrapped to the terminal)."""
    text = ("JCT: a job's completion time, submission to end; wait: submission to start; SM and "
            "mem: time-averaged utilization of all GPUs.")
    if versus:
        tolerance = next(iter(versus.values())).tolerance
        text += (" Job by job: each job's completion time over its time under exclusive (a plain "
                 f"queue, same trace); worse: ratio > {1 + tolerance:g}, or not done.")
    return text


def write_versus_csv(versus: dict[str, tuple[VersusExclusive, dict[str, float]]], path: Path) -> None:
    """Per policy and job, its completion time over its time under ``exclusive``."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "id", "ratio"])
        for name, (_, ratios) in versus.items():
            for job_id, ratio in ratios.items():
                writer.writerow([name, job_id, round(ratio, 4)])


def write_jobs_csv(results: Sequence[SimResult], path: Path) -> None:
    """One row per job and policy; times to 0.1 s and sizes to 0.1 MiB (no float noise)."""
    fields = ["policy", "id", "name", "gpus", "submit_s", "start_s", "end_s", "state", "attempts",
              "oom_crashes", "peak_mib", "mem_mib", "last_gpus", "reason"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for result in results:
            for r in result.records:
                writer.writerow([result.policy, r.id, r.name, r.gpus, _round(r.submit),
                                 _round(r.start), _round(r.end), r.state, r.attempts,
                                 r.oom_crashes, _round(r.peak_mib), _round(r.mem_mib),
                                 r.last_gpus, r.reason])


def _round(value: float | None) -> float | str:
    return "" if value is None else round(value, 1)


def write_plots(results: Sequence[SimResult], out: Path) -> list[Path]:
    """JCT CDF per policy, and per policy a Gantt chart of who ran on which GPU when."""
    from collocate.common.plotting import pyplot

    plt = pyplot()
    import numpy as np

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jct = np.sort([c / 60 for r in result.records if (c := r.completion_s) is not None])
        if jct.size:
            ax.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=result.policy)
    ax.set_xlabel("job completion time (min)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    for result in results:
        bars, gpus = gantt_bars(result)
        if not bars:
            continue
        shown = sorted({b.gpu for b in bars})
        fig, ax = plt.subplots(figsize=(11, 1.2 + 0.45 * len(shown)))
        scope = "" if len(shown) == len(gpus) else f" (first {len(shown)} of {len(gpus)} GPUs)"
        draw_gantt(ax, bars, title=f"{result.policy}: jobs on each GPU{scope}")
        fig.tight_layout()
        path = out / f"timeline_{result.policy}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def gantt_bars(result: SimResult, max_gpus: int = MAX_GANTT_GPUS) -> tuple[list[Bar], list[str]]:
    """A bar per attempt and GPU (minutes), on the first ``max_gpus`` GPUs any job used, and
    every GPU used; an attempt still running when the run ended stops at the makespan."""
    used: list[str] = []
    for r in result.records:
        for gpus, *_ in r.spans:
            used += [g for g in gpus.split(",") if g not in used]
    keep = set(sorted(used, key=natural)[:max_gpus])
    bars = [Bar(g, r.id, start / 60, (result.makespan_s if end is None else end) / 60,
                outcome if outcome in ("oom", "failed") else "")
            for r in result.records for gpus, start, end, outcome in r.spans
            for g in gpus.split(",") if g in keep]
    return bars, used
