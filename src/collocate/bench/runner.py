"""Run benchmark scenarios: N worker processes at once on one GPU, the GPU sampled meanwhile.

Why processes started together with a go signal: each worker warms up at its own pace (CUDA
context, cuDNN autotuning), so the runner waits until all are warm, then tells all to measure
at once; workers keep training before and after their own measurement, so every measurement
window sees the full contention of the scenario. The GPU numbers of a scenario are taken over
the interval in which *all* its workers were measuring.

Under MPS the runner starts the MPS control daemon (``collocate.gpus.mps.MpsControl``) before
the first MPS scenario of a block and stops it after the last, and gives every worker the MPS
client environment. Workers start from argv lists; exit codes are checked and a failing
worker's stderr tail is kept in the scenario's record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from collocate.bench.plan import ALONE, Scenario, estimate_seconds
from collocate.bench.sampling import BenchSampler, sample_dict, summarize
from collocate.common.errors import CollocateError
from collocate.gpus.base import GpuBackend

CONTEXT_MIB = 600.0  # CUDA context + cuDNN/cuBLAS workspaces beyond torch's reserved memory
MEM_MARGIN = 0.95  # fill at most this fraction of the GPU when deciding what fits
IDLE_SECONDS = 3.0
RESULTS, SAMPLES = "results.jsonl", "samples.jsonl"


@dataclass(frozen=True)
class RunOptions:
    """How every scenario runs; ``worker_args`` are extra arguments for every worker."""

    device: str = "cuda"  # "cuda" or "cpu"
    seconds: float = 10.0
    warmup: float = 5.0
    size: str | None = None  # worker default: full on cuda, tiny on cpu
    precision: str = "fp32"
    period_s: float = 0.5
    ready_timeout_s: float = 300.0
    python: str = sys.executable
    worker_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


class MpsLike(Protocol):
    """What the runner needs from ``MpsControl`` (tests pass a recorder)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def client_env(self, **kwargs: object) -> dict[str, str]: ...


def worker_argv(opts: RunOptions, name: str, files: dict[str, Path]) -> list[str]:
    argv = [opts.python, "-m", "collocate.bench.worker", "--workload", name,
            "--seconds", f"{opts.seconds:g}", "--warmup", f"{opts.warmup:g}",
            "--device", opts.device, "--precision", opts.precision,
            "--out", str(files["out"]), "--ready-file", str(files["ready"]),
            "--go-file", str(files["go"]), "--stop-file", str(files["stop"]),
            "--wait-timeout", f"{opts.ready_timeout_s + opts.seconds + 60:g}"]
    if opts.size:
        argv += ["--size", opts.size]
    return argv + list(opts.worker_args)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class _Procs:
    """The worker processes of one scenario; always reaped, by process group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> None:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            self.procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=err,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def exited(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is not None]

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait(timeout=10)


def _wait_all(paths: Sequence[Path], procs: _Procs, timeout: float, what: str) -> str | None:
    """None when every path exists; else why not (a worker exited, or the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() for p in paths):
            return None
        gone = [i for i in procs.exited() if not paths[i].exists()]
        if gone:
            return f"worker {gone[0]} exited before {what}"
        time.sleep(0.1)
    return f"timed out after {timeout:g} s waiting for {what}"


def run_scenario(
    scenario: Scenario,
    *,
    backend: GpuBackend,
    uuid: str,
    work_dir: Path,
    opts: RunOptions,
    mps: MpsLike | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one scenario; returns its record and the raw GPU samples (as dicts)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    go, stop = work_dir / "go", work_dir / "stop"
    for f in (go, stop):
        f.unlink(missing_ok=True)
    env = dict(opts.env)
    if opts.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = uuid
    if scenario.sharing == "mps":
        env.update(mps.client_env() if mps is not None else {})
    jobs = []
    for i, name in enumerate(scenario.jobs):
        files = {"out": work_dir / f"job{i}.json", "ready": work_dir / f"job{i}.ready",
                 "go": go, "stop": stop, "stdout": work_dir / f"job{i}.out",
                 "stderr": work_dir / f"job{i}.err"}
        for key in ("out", "ready"):
            files[key].unlink(missing_ok=True)
        jobs.append((name, files))
    procs = _Procs()
    started = time.time()
    status, reason = "ok", ""
    with BenchSampler(backend, uuid, period_s=opts.period_s) as sampler:
        try:
            for name, files in jobs:
                procs.start(worker_argv(opts, name, files), env, files["stdout"], files["stderr"])
            why = _wait_all([f["ready"] for _, f in jobs], procs, opts.ready_timeout_s,
                            "warm-up")
            if why is None:
                go.touch()
                why = _wait_all([f["out"] for _, f in jobs], procs,
                                opts.seconds * 3 + 120, "the measurement")
            stop.touch()
            codes = procs.wait(60.0 if why is None else 2.0)
        finally:
            stop.touch()
            procs.kill()
    if why is not None:
        status, reason = "failed", why
    records = []
    for i, (name, files) in enumerate(jobs):
        doc = _read_json(files["out"]) or {"status": "failed", "error": "no result file"}
        code = codes[i] if i < len(codes) else None
        entry = {"index": i, "workload": name, "exit_code": code, **doc}
        if doc.get("status") != "ok" or code not in (0, None):
            entry["stderr_tail"] = _tail(files["stderr"])
            if doc.get("status") == "oom":
                status = "oom"
            elif status == "ok":
                status, reason = "failed", f"worker {i} ({name}) exited with {code}"
        records.append(entry)
    ok = [r for r in records if r.get("status") == "ok"]
    if ok:
        start = max(r["measure_start"] for r in ok)
        end = min(r["measure_end"] for r in ok)
        if end <= start:  # no common window: fall back to the union
            start, end = min(r["measure_start"] for r in ok), max(r["measure_end"] for r in ok)
    else:
        start, end = started, time.time()
    window = sampler.between(start, end)
    gpu = summarize(window, [r["pid"] for r in records if "pid" in r])
    record = {
        "scenario": scenario.id, "kind": scenario.kind, "sharing": scenario.sharing,
        "workloads": list(scenario.jobs), "copies": len(scenario.jobs), "status": status,
        "reason": reason, "started": started, "ended": time.time(), "window": [start, end],
        "mps_started": scenario.sharing == "mps" and mps is not None,
        "gpu": gpu, "jobs": records, "sampler_errors": sampler.errors,
    }
    raw = [{"scenario": scenario.id, **sample_dict(s)} for s in sampler.samples]
    return record, raw


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_results(path: Path) -> list[dict[str, Any]]:
    """Records of a results.jsonl (empty when the file does not exist)."""
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                raise CollocateError(f"{path}:{n}: not valid JSON ({exc})",
                                     hint="remove the broken line (an interrupted write)") from None
    return out


def solo_memory(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per workload, the GPU memory one process needs, from its ``alone`` record.

    The larger of NVML's per-process figure and torch's reserved memory plus a context allowance;
    unknown (absent) on CPU runs.
    """
    out: dict[str, float] = {}
    for r in records:
        if r.get("kind") != "alone" or r.get("status") != "ok" or not r.get("jobs"):
            continue
        job = r["jobs"][0]
        nvml = r["gpu"].get("process_mem_mib", {}).get(str(job.get("pid")))
        torch_mib = job.get("max_memory_reserved_mib")
        candidates = [v for v in (nvml, None if torch_mib is None else torch_mib + CONTEXT_MIB)
                      if v is not None]
        if candidates:
            out[r["workloads"][0]] = max(candidates)
    return out


def fits(scenario: Scenario, need: Mapping[str, float], total_mib: float) -> str | None:
    """None when the scenario's solo memory fits the GPU (or is unknown), else the reason."""
    if any(w not in need for w in scenario.jobs):
        return None
    total = sum(need[w] for w in scenario.jobs)
    if total > MEM_MARGIN * total_mib:
        return (f"needs about {total:.0f} MiB ({len(scenario.jobs)} processes at their solo peak), "
                f"more than {MEM_MARGIN:.0%} of the GPU's {total_mib:.0f} MiB")
    return None


def idle_record(backend: GpuBackend, uuid: str, seconds: float = IDLE_SECONDS) -> dict[str, Any]:
    """The GPU with nothing of ours running: idle power for the power model."""
    with BenchSampler(backend, uuid, period_s=0.25) as sampler:
        time.sleep(seconds)
    return {"scenario": "idle", "kind": "idle", "sharing": "none", "workloads": [], "copies": 0,
            "status": "ok", "reason": "", "gpu": summarize(sampler.samples), "jobs": []}


def run_plan(
    plan: Sequence[Scenario],
    *,
    backend: GpuBackend,
    uuid: str,
    total_mib: float,
    out_dir: Path,
    opts: RunOptions,
    env_info: Mapping[str, Any],
    mps_factory: Callable[[], MpsLike] | None = None,
    budget_s: float | None = None,
    resume: bool = False,
    work_root: Path | None = None,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> list[dict[str, Any]]:
    """Run the plan, appending one JSON line per scenario to ``out_dir/results.jsonl``.

    ``resume`` skips scenarios already recorded there; ``budget_s`` stops before a scenario that
    would end past the budget (run again with ``resume`` to go on). A scenario's expected time is
    the static estimate or, when longer, the longest scenario of at most as many processes seen
    so far (in this run or, on resume, in the file): seven processes start up and warm up slower
    than one. Returns every record in the file. MPS is started around each block of consecutive
    MPS scenarios. Workers' scratch files go to ``work_root`` (default: a temporary folder,
    removed at the end).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="collocate-bench-")) if work_root is None else work_root
    results_path, samples_path = out_dir / RESULTS, out_dir / SAMPLES
    if not resume:
        for p in (results_path, samples_path):
            p.unlink(missing_ok=True)
    kept = [r for r in read_results(results_path) if r.get("status") != "failed"]
    if resume and results_path.exists():  # failed scenarios are tried again
        results_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    done = {r["scenario"] for r in kept}
    took: dict[int, float] = {}  # copies -> longest wall time of a scenario that ran
    for r in kept:
        if r.get("status") in ("ok", "oom") and r.get("started") and r.get("ended"):
            n = int(r.get("copies") or 1)
            took[n] = max(took.get(n, 0.0), float(r["ended"]) - float(r["started"]))
    begin = clock()
    if "idle" not in done:
        _append(results_path, [{**idle_record(backend, uuid), "env": dict(env_info)}])
    need = solo_memory(read_results(results_path))
    todo = [s for s in plan if s.id not in done]
    per = estimate_seconds([Scenario(("x",), ALONE)], warmup_s=opts.warmup, seconds=opts.seconds)
    mps: MpsLike | None = None
    mps_error = ""
    raw: list[dict[str, Any]]
    try:
        for k, scenario in enumerate(todo):
            n = len(scenario.jobs)
            expected = max([per, *(t for c, t in took.items() if c <= n)])
            if budget_s is not None and clock() - begin + expected > budget_s:
                log(f"budget of {budget_s:g} s reached: {len(todo) - k} scenario(s) left; "
                    "run again with --resume to go on")
                break
            skip = fits(scenario, need, total_mib)
            if skip is None and scenario.sharing == "mps" and mps_error:
                skip = mps_error
            if skip is None and scenario.sharing == "mps" and mps is None and mps_factory:
                try:
                    candidate = mps_factory()
                    candidate.start()
                    mps = candidate
                except CollocateError as exc:
                    mps_error = f"MPS could not start: {exc}"
                    skip = mps_error
                    log(f"    {mps_error}")
            elif skip is None and scenario.sharing != "mps" and mps is not None:
                _stop(mps, log)
                mps = None
            if skip is not None:
                record, raw = _skipped(scenario, skip), []
                if skip == mps_error:
                    record["status"] = "failed"
            else:
                log(f"[{k + 1}/{len(todo)}] {scenario.id}")
                t0 = clock()
                record, raw = run_scenario(scenario, backend=backend, uuid=uuid,
                                           work_dir=scratch / f"s{k}", opts=opts,
                                           mps=mps if scenario.sharing == "mps" else None)
                took[n] = max(took.get(n, 0.0), clock() - t0)
            record["env"] = dict(env_info)
            _append(results_path, [record])
            _append(samples_path, raw)
            if scenario.sharing == ALONE:
                need = solo_memory(read_results(results_path))
            log(f"    {record['status']}{': ' + record['reason'] if record['reason'] else ''}")
    finally:
        if mps is not None:
            _stop(mps, log)
        if work_root is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return read_results(results_path)


def _stop(mps: MpsLike, log: Callable[[str], None]) -> None:
    try:
        mps.stop()
    except CollocateError as exc:
        log(f"warning: {exc}")


def _skipped(scenario: Scenario, why: str) -> dict[str, Any]:
    return {"scenario": scenario.id, "kind": scenario.kind, "sharing": scenario.sharing,
            "workloads": list(scenario.jobs), "copies": len(scenario.jobs), "status": "skipped",
            "reason": why, "gpu": {}, "jobs": []}


def _append(path: Path, rows: Iterator[dict[str, Any]] | Sequence[dict[str, Any]]) -> None:
    with open(path, "a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
