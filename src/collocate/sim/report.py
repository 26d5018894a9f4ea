"""Writing a comparison: the terminal table, the JSON document, per-job CSV and PNG plots."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from collocate.sim.engine import SimResult
from collocate.sim.metrics import Summary

COLUMNS = (
    ("policy", "policy"),
    ("makespan_min", "makespan"),
    ("mean_jct_min", "JCT mean"),
    ("median_jct_min", "JCT p50"),
    ("p95_jct_min", "JCT p95"),
    ("mean_wait_min", "wait"),
    ("sm_util", "SM"),
    ("mem_util", "mem"),
    ("energy_kwh", "kWh"),
    ("oom_crashes", "OOM"),
    ("recovered_jobs", "recov."),
    ("failed", "failed"),
    ("rejected", "rej."),
)


def table(summaries: Sequence[Summary], title: str) -> Table:
    out = Table(
        title=title,
        caption="times in minutes; SM and mem are time-averaged utilization of all GPUs",
        pad_edge=False,
    )
    for _, header in COLUMNS:
        out.add_column(header, justify="left" if header == "policy" else "right", no_wrap=True)
    for s in summaries:
        row = s.as_dict()
        out.add_row(*(_fmt(row[key]) for key, _ in COLUMNS))
    return out


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value < 1 else f"{value:.1f}"
    return str(value)


def write_jobs_csv(results: Sequence[SimResult], path: Path) -> None:
    fields = ["policy", "id", "name", "gpus", "submit_s", "start_s", "end_s", "state", "attempts",
              "oom_crashes", "peak_mib", "mem_mib", "last_gpus", "reason"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for result in results:
            for r in result.records:
                writer.writerow([result.policy, r.id, r.name, r.gpus, r.submit, r.start, r.end, r.state,
                                 r.attempts, r.oom_crashes, r.peak_mib, r.mem_mib, r.last_gpus, r.reason])


def write_plots(results: Sequence[SimResult], out: Path) -> list[Path]:
    """JCT CDF per policy, and per policy the memory and SM timelines of the first GPUs."""
    from collocate.plotting import pyplot

    plt = pyplot()
    import numpy as np

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jct = np.sort([(r.end - r.submit) / 60 for r in result.records if r.state == "done"])
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
        gpus = list(result.timelines)[:8]
        if not gpus:
            continue
        fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
        for gpu in gpus:
            t, mem, busy = zip(*result.timelines[gpu])
            minutes = np.array(t) / 60
            axes[0].step(minutes, np.array(mem) / 1024, where="post", label=gpu, linewidth=1)
            axes[1].step(minutes, busy, where="post", label=gpu, linewidth=1)
        axes[0].set_ylabel("allocated (GiB)")
        axes[1].set_ylabel("SM busy")
        axes[1].set_xlabel("time (min)")
        axes[0].set_title(f"{result.policy}: per-GPU memory and SM activity")
        axes[0].legend(fontsize=7, ncol=4)
        fig.tight_layout()
        path = out / f"timeline_{result.policy}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
