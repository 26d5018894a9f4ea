"""`collocate demo`: the daemon on emulated GPUs, one small trace under several policies.

Each policy gets its own daemon (a real ``collocate serve`` process, fresh state dir in a temp
folder that is removed afterwards) on ``emulated:4xA100-40GB``. The same trace of emulated
training jobs (``collocate emulate-job``) is submitted to each; some jobs declare less memory
than they really take, so under a collocating policy they crash out of memory and are recovered.
The daemons run side by side (emulated GPUs are independent per state dir), progress is shown
live, and a table compares makespan, mean job completion time (JCT), OOM crashes and recoveries.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from collocate.common.errors import InputError
from collocate.daemon.child import DaemonProcess

GPUS = "emulated:4xA100-40GB"
PERIOD_S = 0.25
START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One job of the trace: what it really uses (``mem``/``peak``) and what it declares."""

    name: str
    seconds: float
    mem_mib: float
    declared_mib: float | None  # None: submitted without --mem
    sm: float
    peak_mib: float | None = None

    @property
    def under_estimated(self) -> bool:
        real = max(self.mem_mib, self.peak_mib or 0.0)
        return self.declared_mib is not None and self.declared_mib < real


# A small mixed trace. The four big jobs come first and fill the GPUs; three jobs then declare a
# few GiB but really peak at 30 GiB: a collocating policy puts them next to a big job and they
# crash out of memory, get requeued with the raised requirement and finish alone. Two jobs
# declare nothing (a GPU of their own under memory-aware policies).
TRACE: tuple[DemoJob, ...] = (
    DemoJob("resnet50-big", 16, 30000, 32768, 0.70),
    DemoJob("gpt2-small", 18, 22000, 24576, 0.60),
    DemoJob("bert-base-ft", 16, 14000, 16384, 0.55),
    DemoJob("t5-small-ft", 14, 12000, 14336, 0.45),
    DemoJob("vit-under", 10, 3000, 4096, 0.30, peak_mib=30000),
    DemoJob("lstm-under", 10, 2000, 3072, 0.20, peak_mib=30000),
    DemoJob("dlrm-under", 10, 4000, 5120, 0.25, peak_mib=30000),
    DemoJob("resnet18-sweep-a", 12, 5000, 6144, 0.35),
    DemoJob("resnet18-sweep-b", 12, 5000, 6144, 0.35),
    DemoJob("mobilenet-a", 10, 3500, 4096, 0.25),
    DemoJob("mobilenet-b", 10, 3500, 4096, 0.25),
    DemoJob("efficientnet", 12, 6000, 7168, 0.35),
    DemoJob("unet-unknown", 10, 8000, None, 0.40),
    DemoJob("tiny-mlp-a", 8, 1500, 2048, 0.10),
    DemoJob("tiny-mlp-b", 8, 1500, 2048, 0.10),
    DemoJob("gnn-unknown", 8, 4000, None, 0.30),
)


def job_argv(job: DemoJob, scale: float) -> list[str]:
    argv = [sys.executable, "-m", "collocate.cli", "emulate-job", "--mem", f"{job.mem_mib:.0f}MiB",
            "--seconds", f"{job.seconds * scale:.2f}", "--sm", f"{job.sm}", "--ramp", f"{min(2.0, scale * 2):.2f}"]
    if job.peak_mib is not None:
        argv += ["--peak-mem", f"{job.peak_mib:.0f}MiB", "--peak-at", "0.4"]
    return argv


class DemoRun:
    """One policy's daemon and its jobs."""

    def __init__(self, policy: str, root: Path, scale: float) -> None:
        from collocate.core.policies import policy_parameters

        self.policy, self.scale = policy, scale
        self.state_dir = root / policy
        self.state_dir.mkdir(parents=True)
        params: list[str] = []
        if "settle_s" in policy_parameters(policy):
            # Emulated jobs reach their first memory within the 2 s ramp: a short settle is honest.
            params = ["--param", f"settle_s={max(1.0, 3.0 * scale):.1f}"]
        self.daemon = DaemonProcess(
            self.state_dir, ["--gpus", GPUS, "--policy", policy, "--period", str(PERIOD_S), *params],
            root / f"{policy}.log", name=f"the {policy} daemon")
        self.client = self.daemon.client
        self.rows: list[dict[str, Any]] = []

    def wait_ready(self) -> None:
        self.daemon.wait_ready(START_TIMEOUT_S)

    def submit_all(self, cwd: Path) -> None:
        for job in TRACE:
            mem = None if job.declared_mib is None else f"{job.declared_mib:.0f}MiB"
            self.client.request("submit", argv=job_argv(job, self.scale), mem=mem, name=job.name,
                                cwd=str(cwd), base_env=dict(os.environ))

    def poll(self) -> None:
        self.rows = self.client.request("ls", all=True)

    @property
    def finished(self) -> bool:
        return bool(self.rows) and all(r["state"] in ("done", "failed", "cancelled", "rejected") for r in self.rows)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("pending", "running", "done", "failed")}
        for r in self.rows:
            out[r["state"]] = out.get(r["state"], 0) + 1
        out["oom"] = sum(r["oom_crashes"] for r in self.rows)
        return out

    def metrics(self) -> dict[str, float]:
        ends = [r["end_time"] for r in self.rows if r["end_time"] is not None]
        submits = [r["submit_time"] for r in self.rows]
        jct = [r["end_time"] - r["submit_time"] for r in self.rows if r["end_time"] is not None]
        return {
            "makespan": max(ends) - min(submits) if ends else float("nan"),
            "mean_jct": sum(jct) / len(jct) if jct else float("nan"),
            "oom": sum(r["oom_crashes"] for r in self.rows),
            "recovered": sum(1 for r in self.rows if r["oom_crashes"] and r["state"] == "done"),
            "failed": sum(1 for r in self.rows if r["state"] == "failed"),
            "done": sum(1 for r in self.rows if r["state"] == "done"),
        }

    def stop(self) -> None:
        self.daemon.stop(timeout_s=10)
        for record in self.state_dir.glob("jobs/*/attempt-*/runner.json"):
            try:
                os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass


def demo(
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policies to compare.")] = "exclusive,auto",
    scale: Annotated[float, typer.Option("--scale", help="Multiply every job's duration by this.")] = 1.0,
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after this many seconds.")] = 300.0,
    fmt: Annotated[str, typer.Option("--format", help="table (for people: live progress, then "
                   "the result) or json (the result, one object per policy, nothing live).")] = "table",
) -> None:
    """Run the daemon on 4 emulated A100s and compare placement policies on a small trace."""
    from rich.console import Console
    from rich.live import Live

    from collocate.core.policies import POLICY_NAMES

    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        if name not in POLICY_NAMES:
            raise InputError(f"unknown policy {name!r}", hint=f"valid policies: {', '.join(POLICY_NAMES)}")
    if not names or scale <= 0:
        raise InputError("give at least one policy and a --scale above 0")
    if fmt not in ("table", "json"):
        raise InputError(f"unknown --format {fmt!r}", hint="use table or json")
    console = Console() if sys.stdout.isatty() else Console(width=120)
    if fmt == "json":  # the live table and the words go to stderr, the result alone to stdout
        console = Console(stderr=True, quiet=not sys.stderr.isatty())
    under = sum(j.under_estimated for j in TRACE)
    console.print(f"[bold]collocate demo[/bold]: {len(TRACE)} emulated training jobs ({under} under-estimated, "
                  f"{sum(j.declared_mib is None for j in TRACE)} without --mem) on {GPUS}, "
                  f"policies {', '.join(names)}")
    root = Path(tempfile.mkdtemp(prefix="collocate-demo-"))
    runs: list[DemoRun] = []
    try:
        runs = [DemoRun(p, root, scale) for p in names]
        for r in runs:
            r.wait_ready()
        for r in runs:
            r.submit_all(root)
        t0 = time.monotonic()
        with Live(progress_table(runs, 0.0), console=console, refresh_per_second=4) as live:
            while time.monotonic() - t0 < timeout:
                for r in runs:
                    r.poll()
                live.update(progress_table(runs, time.monotonic() - t0))
                if all(r.finished for r in runs):
                    break
                time.sleep(0.5)
        console.print()
        if not all(r.finished for r in runs):
            console.print(f"[red]stopped after {timeout:.0f} s with jobs still running[/red]")
        if fmt == "json":
            typer.echo(json.dumps([{"policy": r.policy, "finished": r.finished, **r.metrics()} for r in runs],
                                  indent=1))
        else:
            console.print(result_table(runs))
    finally:
        for r in runs:
            r.stop()
        shutil.rmtree(root, ignore_errors=True)


def progress_table(runs: list[DemoRun], elapsed: float):
    table = _table(f"live progress ({elapsed:.0f} s)", ("policy", "pending", "running", "done", "failed", "OOM crashes"))
    for r in runs:
        c = r.counts()
        table.add_row(r.policy, str(c["pending"]), str(c["running"]), str(c["done"]), str(c["failed"]), str(c["oom"]))
    return table


def result_table(runs: list[DemoRun]):
    """The comparison, 80 columns wide at most: no box, one space between columns, no cell cut."""
    table = _table("result (same trace, same emulated GPUs)",
                   ("policy", "makespan", "mean JCT", "done", "failed", "OOM crashes", "recovered", "vs first"))
    base = runs[0].metrics() if runs else {}
    for r in runs:
        m = r.metrics()
        speed = base["makespan"] / m["makespan"] if m["makespan"] else float("nan")
        table.add_row(r.policy, f"{m['makespan']:.1f} s", f"{m['mean_jct']:.1f} s", str(m["done"]),
                      str(m["failed"]), str(m["oom"]), str(m["recovered"]), f"{speed:.2f}x")
    return table


def _table(title: str, columns: tuple[str, ...]):
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False,
                  padding=(0, 0, 0, 1))
    for col in columns:
        table.add_column(col, justify="right" if col != "policy" else "left", no_wrap=True)
    return table
