"""One Gantt chart of who held which GPU when, for ``collocate report`` and ``collocate simulate``.

A row per GPU, a bar per job while it was on it; jobs that shared a GPU at the same time get
lanes side by side in its row, so collocation is visible at a glance. An attempt that ended in
an OOM crash ends with a red cross, a failed one with a black one. matplotlib is imported by the
caller (and only when plotting), so this module needs nothing at import time.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collocate.common.plotting import pyplot

MARKERS = {"oom": ("X", "#d62728", "OOM crash"), "failed": ("x", "black", "failed")}
MAX_LABELS = 150  # beyond this many bars, job labels would only be ink


@dataclass(frozen=True)
class Bar:
    gpu: str
    job: str
    start: float  # minutes
    end: float
    outcome: str = ""  # "oom" or "failed" draws a marker at the end


def lanes(spans: Sequence[tuple[str, tuple[float, float]]]
          ) -> list[tuple[str, tuple[float, float], int]]:
    """Give overlapping spans different lanes (the lowest free one)."""
    ends: list[float] = []
    out = []
    for job, (start, end) in sorted(spans, key=lambda s: s[1][0]):
        lane = next((i for i, e in enumerate(ends) if e < start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        out.append((job, (start, end), lane))
    return out


def draw_gantt(ax: Any, bars: Sequence[Bar], *, title: str, xlabel: str = "time (min)") -> None:
    """Draw ``bars`` on the matplotlib axes ``ax``: a row per GPU (in order of first use)."""
    plt = pyplot()

    rows = sorted({b.gpu for b in bars}, key=natural)
    colours = plt.get_cmap("tab20")
    labelled = len(bars) <= MAX_LABELS
    seen: set[str] = set()
    for row, gpu in enumerate(rows):
        here = [b for b in bars if b.gpu == gpu]
        placed = lanes([(str(i), (b.start, b.end)) for i, b in enumerate(here)])
        height = 0.8 / (max((lane for *_, lane in placed), default=0) + 1)
        for key, (start, end), lane in placed:
            bar = here[int(key)]
            bottom = row - 0.4 + lane * height
            ax.broken_barh([(start, max(1e-3, end - start))], (bottom, height * 0.9),
                           color=colours(_colour_index(bar.job)))
            if labelled:
                ax.text(start, bottom + height / 2, f" {bar.job}", va="center", fontsize=7,
                        clip_on=True)
            if bar.outcome in MARKERS:
                marker, colour, label = MARKERS[bar.outcome]
                ax.plot([end], [bottom + height * 0.45], marker=marker, color=colour,
                        markersize=7, linestyle="none",
                        label=None if bar.outcome in seen else label)
                seen.add(bar.outcome)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(-0.6, max(1, len(rows)) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    if seen:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _colour_index(job: str) -> int:
    return (int(job) if job.isdigit() else zlib.crc32(job.encode())) % 20


def natural(name: str) -> tuple:
    """``n0:2`` before ``n0:10``."""
    import re

    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name))
