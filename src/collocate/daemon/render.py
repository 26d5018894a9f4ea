"""Tables for the client commands (rich), kept apart from parsing so both stay short."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from collocate.units import format_mib


def console() -> Console:
    """A console that does not squeeze tables to 80 columns when output is piped."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=200)


def _mib(value: float | None) -> str:
    return "-" if value is None else format_mib(value)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def print_jobs(rows: list[dict[str, Any]]) -> None:
    table = Table(box=None, header_style="bold")
    for col in ("ID", "NAME", "STATE", "USER", "GPUS", "MEM", "SOURCE", "TRIES", "OOM", "ON", "SUBMIT", "REASON"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["name"][:24], r["state"], r["user"], str(r["gpus"]), _mib(r["mem_mib"]),
                      r["mem_source"], str(r["attempts"]), str(r["oom_crashes"]), ",".join(r["on"]),
                      _when(r["submit_time"]), (r["reason"] or "")[:60])
    console().print(table)


def print_detail(d: dict[str, Any]) -> None:
    c = console()
    c.print(f"[bold]job {d['id']}[/bold] {d['name']}: {d['state']}"
            + (f" ({d['reason']})" if d["reason"] else ""))
    c.print(f"  command   {' '.join(d['argv'])}", markup=False)
    c.print(f"  cwd       {d['cwd']}", markup=False)
    c.print(f"  user      {d['user']}")
    c.print(f"  gpus      {d['gpus']}   memory {_mib(d['mem_mib'])} ({d['mem_source']})")
    if d.get("profile"):
        p = d["profile"]
        c.print(f"  activity  SM {p['sm_activity']:.2f}, DRAM {p['dram_activity']:.2f} alone"
                f" ({p['source']})")
    c.print(f"  retries   {d['attempts_used']} attempt(s) of {d['max_retries'] + 1} allowed, "
            f"{d['oom_crashes']} out-of-memory crash(es)")
    if d.get("after"):
        c.print(f"  after     job(s) {', '.join(d['after'])} (must end done first)")
    c.print(f"  submitted {_when(d['submit_time'])}   ended {_when(d['end_time'])}")
    table = Table(box=None, header_style="bold", title="attempts", title_justify="left")
    for col in ("#", "START", "END", "GPU", "MEM", "PEAK", "EXIT", "OUTCOME", "REASON"):
        table.add_column(col)
    for a in d["attempts"]:
        table.add_row(str(a["n"]), _when(a["start"]), _when(a["end"]), ",".join(a["gpus"]),
                      _mib(a["mem_mib"]), _mib(a["peak_mib"]),
                      "-" if a["returncode"] is None else str(a["returncode"]),
                      a["outcome"] or "running", (a["reason"] or "")[:70])
    c.print(table)
    for line in measured_lines(d.get("summary")):
        c.print(line, markup=False)


def measured_lines(summary: dict[str, Any] | None) -> list[str]:
    """``collocate show``'s "measured" block from the monitoring store's ``JobSummary`` dict."""
    if not summary:
        return []
    from collocate.monitor.report import summary_lines
    from collocate.monitor.store import JobSummary

    fields = {k: summary[k] for k in JobSummary.__slots__ if k in summary}  # type: ignore[attr-defined]
    try:
        s = JobSummary(**{**fields, "gpus": tuple(summary.get("gpus", ()))})
    except TypeError:  # a daemon of another version: show nothing rather than fail
        return []
    return ["measured", *(f"  {line}" for line in summary_lines(s))]


def tracking_line(ping: dict[str, Any]) -> str | None:
    """"tracking degraded: mlflow (reason)" when a monitoring sink is failing, else None."""
    bad = [t for t in ping.get("tracking", []) if t.get("degraded")]
    if not bad:
        return None
    return "tracking degraded: " + "; ".join(
        f"{t['sink']} ({t.get('reason') or 'unknown'}; {t.get('pending', 0)} pending, "
        f"{t.get('dropped', 0)} dropped, retry in {t.get('retry_in_s', 0):.0f} s)" for t in bad)


def gpu_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("GPU", "TYPE", "USED", "TOTAL", "SM NOW", "SM WINDOW", "JOBS"):
        table.add_column(col)
    for r in rows:
        sm = "-" if r["sm_now"] is None else f"{r['sm_now'] * 100:.0f}%"
        table.add_row(r["id"], r["type"], _mib(r["used_mib"]), _mib(r["total_mib"]), sm,
                      f"{r['sm_window'] * 100:.0f}%", ",".join(r["jobs"]) or "-")
    return table
