"""Replay the mini-trace through the real daemon, and compare with the simulator.

``run_minitrace`` starts ``collocate serve`` (its own state directory, the given policy and
sharing mode), submits each job with ``collocate submit`` at its arrival time, samples the GPU
through the backend interface meanwhile, waits until every job has ended, saves
``collocate ls --all --format json`` and stops the daemon. It then summarises makespan, mean JCT,
SM activity, energy and OOM crashes in the units ``collocate simulate --format json`` uses
(minutes, kWh), so ``compare`` can put both side by side.

With ``emulate=True`` (CPU dry runs) the jobs are ``collocate emulate-job`` processes on emulated
GPUs, holding each job's memory for its expected duration: the whole orchestration runs for real
without a GPU, and the numbers are those of the emulation, labelled so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from collocate.bench.minitrace import MiniJob
from collocate.bench.sampling import BenchSampler, sample_dict
from collocate.common.errors import CollocateError, InputError
from collocate.daemon.child import DaemonProcess

TERMINAL = ("done", "failed", "cancelled", "rejected")


def job_argv(job: MiniJob, *, python: str, out: Path, emulate: bool, time_scale: float,
             device: str) -> list[str]:
    """The command the daemon launches for one job."""
    if emulate:
        return [python, "-m", "collocate.cli", "emulate-job", "--mem", f"{int(job.peak_mib)}MiB",
                "--seconds", f"{max(0.2, job.duration_s * time_scale):.2f}",
                "--sm", f"{job.sm_activity:g}", "--dram", f"{job.dram_activity:g}",
                "--ramp", "0.2"]
    return [python, "-m", "collocate.bench.worker", *job.worker_args(device), "--out", str(out)]


def _cli(python: str) -> list[str]:
    return [python, "-m", "collocate.cli"]


def _sampling_backend(gpus: str, state: Path) -> Any:
    if gpus.startswith("emulated"):
        from collocate.gpus.emulated import EmulatedBackend
        from collocate.gpus.registry import emulated_state_dir

        return EmulatedBackend(emulated_state_dir(state))
    from collocate.gpus.registry import open_backend

    return open_backend(gpus, state_dir=state, node="bench")


def run_minitrace(
    jobs: Sequence[MiniJob],
    *,
    policy: str,
    sharing: str,
    gpus: str,
    out_dir: Path,
    emulate: bool = False,
    time_scale: float = 1.0,
    device: str = "cuda",
    period_s: float = 1.0,
    timeout_s: float | None = None,
    params: Sequence[str] = (),
    python: str = sys.executable,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Replay ``jobs`` through a fresh daemon; writes ls.json, samples.jsonl, workers.jsonl,
    summary.json and daemon.log into ``out_dir`` and returns the summary."""
    if time_scale <= 0:
        raise InputError(f"--time-scale must be > 0, got {time_scale}")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="cbm-"))  # short: the API socket lives here
    scratch = state / "worker-results"
    scratch.mkdir()
    # --verbose: daemon.log keeps every job event, with the activity each attempt learned
    serve_args = ["--gpus", gpus, "--policy", policy, "--sharing", sharing,
                  "--period", f"{period_s:g}", "--verbose"]
    for p in params:
        serve_args += ["--param", p]
    daemon = DaemonProcess(state, serve_args, out_dir / "daemon.log", python=python, client_timeout_s=30)
    submits: list[tuple[MiniJob, subprocess.Popen]] = []
    ids: dict[str, str] = {}
    interrupted = False
    try:
        daemon.wait_ready()
        backend = _sampling_backend(gpus, state)
        uuid = backend.devices()[0].uuid
        limit = timeout_s or (sum(j.duration_s for j in jobs) * time_scale * 3 + 300)
        with BenchSampler(backend, uuid, period_s=period_s) as sampler:
            t0 = time.monotonic()
            for job in sorted(jobs, key=lambda j: j.arrival_s):
                delay = t0 + job.arrival_s * time_scale - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                argv = [*_cli(python), "submit", "--state-dir", str(state),
                        "--mem", f"{int(job.peak_mib)}MiB", "--name", job.name, "--",
                        *job_argv(job, python=python, out=scratch / f"{job.id}.json",
                                  emulate=emulate, time_scale=time_scale, device=device)]
                submits.append((job, subprocess.Popen(argv, stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True)))
                log(f"submitted {job.name} at {time.monotonic() - t0:.1f} s")
            for job, proc in submits:
                out, err = proc.communicate(timeout=120)
                if proc.returncode != 0:
                    raise CollocateError(
                        f"`collocate submit` for {job.name} exited with {proc.returncode}: "
                        f"{err.strip()}", hint=f"see {daemon.log_path}")
                ids[out.strip().splitlines()[-1]] = job.id
            rows, timed_out = _wait_terminal(daemon, set(ids), t0 + limit, log)
        rows = _ls_cli(python, state) or rows
        backend.close()
    except BaseException:
        # Interrupted (Ctrl-C, a caller's time limit) or failed: the daemon's jobs run in their
        # own sessions and outlive a daemon stop, so cancel them first, or they would keep
        # training on the GPU after this run has ended. Submissions still in flight end first,
        # so the daemon knows every job it was given.
        for _, proc in submits:
            try:
                proc.communicate(timeout=30)
            except Exception:  # noqa: BLE001 - best effort on the way out
                proc.kill()
        cancel_all(daemon, log)
        interrupted = True
        raise
    finally:
        code = daemon.stop()
        if interrupted:  # daemon.log in out_dir says what happened; the state is of no more use
            shutil.rmtree(state, ignore_errors=True)
    (out_dir / "ls.json").write_text(json.dumps(rows, indent=1) + "\n")
    with open(out_dir / "samples.jsonl", "w") as handle:
        for s in sampler.samples:
            handle.write(json.dumps(sample_dict(s)) + "\n")
    with open(out_dir / "workers.jsonl", "w") as handle:
        for f in sorted(scratch.glob("*.json")):
            handle.write(json.dumps({"job": f.stem, **json.loads(f.read_text())}) + "\n")
    summary = summarize_run(rows, sampler, ids, policy=policy, sharing=sharing, emulate=emulate)
    summary["time_scale"] = time_scale
    summary["timed_out"] = timed_out
    summary["daemon_exit"] = code
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(state, ignore_errors=True)
    return summary


def cancel_all(daemon: DaemonProcess, log: Callable[[str], None], wait_s: float = 15.0) -> int:
    """Cancel every job of this (private) daemon that has not ended; wait until they have.

    Best effort: returns how many were cancelled, and never raises (it runs while another
    exception is on its way out). The daemon sends SIGTERM, then SIGKILL after 10 s."""
    try:
        rows = daemon.client.request("ls", all=True)
        live = [r["id"] for r in rows if r["state"] not in TERMINAL]
        for job_id in live:
            daemon.client.request("cancel", id=job_id)
        if live:
            log(f"cancelling {len(live)} job(s) that had not ended")
        end = time.monotonic() + wait_s
        while live and time.monotonic() < end:
            rows = daemon.client.request("ls", all=True)
            if all(r["state"] in TERMINAL for r in rows if r["id"] in live):
                break
            time.sleep(0.5)
        return len(live)
    except Exception as exc:  # noqa: BLE001 - best effort on the way out
        log(f"warning: could not cancel the daemon's jobs: {exc}")
        return 0


def _wait_terminal(daemon: DaemonProcess, ids: set[str], deadline: float,
                   log: Callable[[str], None]) -> tuple[list[dict[str, Any]], bool]:
    last = -1
    while True:
        rows = daemon.client.request("ls", all=True)
        ours = [r for r in rows if r["id"] in ids]
        ended = sum(r["state"] in TERMINAL for r in ours)
        if ended != last:
            log(f"{ended}/{len(ids)} jobs ended")
            last = ended
        if ended == len(ids):
            return rows, False
        if time.monotonic() > deadline:
            log(f"timeout: only {ended} of {len(ids)} jobs ended; cancelling the rest")
            for r in ours:
                if r["state"] not in TERMINAL:
                    daemon.client.request("cancel", id=r["id"])
            end = time.monotonic() + 20.0
            while time.monotonic() < end:  # SIGTERM, then SIGKILL after 10 s
                rows = daemon.client.request("ls", all=True)
                if all(r["state"] in TERMINAL for r in rows if r["id"] in ids):
                    break
                time.sleep(1.0)
            return rows, True
        time.sleep(1.0)


def _ls_cli(python: str, state: Path) -> list[dict[str, Any]] | None:
    """``collocate ls --all --format json``: the daemon's own account of every job."""
    argv = [*_cli(python), "ls", "--all", "--format", "json", "--state-dir", str(state)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        return None
    try:
        return json.loads(result.stdout)
    except ValueError:
        return None


def summarize_run(rows: Sequence[dict[str, Any]], sampler: BenchSampler, ids: dict[str, str], *,
                  policy: str, sharing: str, emulate: bool) -> dict[str, Any]:
    """Makespan, JCT, SM activity, energy, OOM crashes: the simulator's summary fields."""
    ours = [r for r in rows if r["id"] in ids]
    done = [r for r in ours if r["state"] == "done" and r.get("end_time")]
    first = min((r["submit_time"] for r in ours), default=0.0)
    last = max((r["end_time"] for r in ours if r.get("end_time")), default=first)
    jct = [(r["end_time"] - r["submit_time"]) / 60.0 for r in done]
    window = sampler.between(first, last)
    sm = [s.sm_activity for s in window if s.sm_activity is not None]
    e0 = window[0].energy_joules if window else None
    e1 = window[-1].energy_joules if window else None
    return {
        "policy": policy, "sharing": sharing, "source": "emulated" if emulate else "real",
        "jobs": len(ours), "done": len(done),
        "failed": sum(r["state"] == "failed" for r in ours),
        "makespan_min": round((last - first) / 60.0, 3),
        "mean_jct_min": round(sum(jct) / len(jct), 3) if jct else None,
        "sm_util": round(sum(sm) / len(sm), 4) if sm else None,
        "energy_kwh": round((e1 - e0) / 3.6e6, 6) if e0 is not None and e1 is not None else None,
        "oom_crashes": sum(int(r.get("oom_crashes") or 0) for r in ours),
        "job_ids": ids,
    }


COMPARE_FIELDS = (("makespan_min", "makespan (min)"), ("mean_jct_min", "mean JCT (min)"),
                  ("sm_util", "SM util"), ("energy_kwh", "energy (kWh)"),
                  ("oom_crashes", "OOM crashes"))


SCALED = ("makespan_min", "mean_jct_min", "energy_kwh")


def compare(real: Sequence[dict[str, Any]], sims: Sequence[dict[str, Any]],
            env: dict[str, Any] | None = None) -> str:
    """Markdown: each real run beside the simulator's prediction for the same policy and mode."""
    predicted: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in sims:
        for p in doc.get("policies", []):
            predicted[(p["policy"], doc.get("sharing", "time-slicing"))] = p
    env = env or {}
    out = ["# Mini-trace: real daemon vs simulator", "",
           f"- device: {env.get('device_name')} (measured on {env.get('measured_on')}), driver "
           f"{env.get('driver')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, "
           f"{env.get('date_utc')}", ""]
    if any(r.get("source") == "emulated" for r in real):
        out += ["**Emulated run (CPU dry run): not GPU measurements.**", ""]
    if any(r.get("time_scale", 1.0) != 1.0 for r in real):  # before the table, not inside it
        out += ["Runs with a time scale: the simulator's times and energy are scaled by it.", ""]
    out += ["| policy | sharing | " + " | ".join(f"{label} real | sim" for _, label in COMPARE_FIELDS)
            + " | makespan error |",
            "|---|---|" + "---:|---:|" * len(COMPARE_FIELDS) + "---:|"]
    for r in real:
        scale = float(r.get("time_scale", 1.0))
        sim = {k: (v * scale if k in SCALED and isinstance(v, float) else v)
               for k, v in predicted.get((r["policy"], r["sharing"]), {}).items()}
        cells = []
        for key, _ in COMPARE_FIELDS:
            cells += [_fmt(r.get(key)), _fmt(sim.get(key))]
        err = "n/a"
        if r.get("makespan_min") and sim.get("makespan_min"):
            err = f"{100 * (sim['makespan_min'] - r['makespan_min']) / r['makespan_min']:+.0f}%"
        out.append(f"| {r['policy']} | {r['sharing']} | " + " | ".join(cells) + f" | {err} |")
    return "\n".join(out) + "\n"


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}" if isinstance(v, float) else str(v)
