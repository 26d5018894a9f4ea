"""The real mini-trace: ≥12 built-in training jobs of mixed sizes with staggered arrivals.

Why fixed work (``--steps``) rather than fixed time: a job slowed down by its neighbours must
take longer, as a real training job does, or collocation would never show in its completion time.
Each job's steps come from its *measured* solo throughput (a ``collocate bench run`` results
file) and a target training time by size, so the trace replays in a few minutes on one GPU.

``build`` writes three files into a folder:

* ``trace.csv`` for ``collocate simulate`` (self-contained form: ``id, arrival_s, gpus,
  duration_s, peak_mib, sm_activity, dram_activity, warmup_s, name``), where ``duration_s`` is
  the measured start-up, plus what the first steps cost beyond the steady rate, plus the steps
  at the solo rate; ``warmup_s`` is that first-step cost (cuDNN autotuning, allocator growth:
  4-9 s for the CNNs on an H100, the bench's warm-up phase measures it), which the simulator
  runs with no GPU activity, as the GPU showed; ``peak_mib`` is the measured per-process memory;
* ``jobs.json`` the same jobs with their worker arguments and provenance, read by
  ``collocate bench minitrace run``;
* ``submit.sh`` the same submissions as plain ``collocate submit`` commands with sleeps, for a
  person who wants to drive the daemon by hand.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collocate.bench.plan import ALONE
from collocate.bench.report import env_of
from collocate.bench.runner import solo_memory
from collocate.bench.workloads import DEFAULT_WORKLOADS, workload
from collocate.common.errors import InputError

TRACE_FIELDS = ("id", "arrival_s", "gpus", "duration_s", "peak_mib", "sm_activity",
                "dram_activity", "warmup_s", "name")
#: Target training seconds (alone) by workload size: short enough for a few-minute replay.
TARGET_S = {"small": (15.0, 35.0), "medium": (25.0, 50.0), "large": (35.0, 70.0)}
DEFAULT_GAP_S = 8.0  # mean of the exponential inter-arrival times
CPU_TRACE_NOTE = ("built from a CPU run: durations, memory and batch sizes are not GPU numbers; "
                  "use this trace only for `minitrace run --emulate` dry runs")
UNKNOWN_MEM_MIB = 2048.0  # CPU runs measure no GPU memory: the dry-run trace assumes this


@dataclass(frozen=True, slots=True)
class MiniJob:
    id: str
    name: str
    workload: str
    arrival_s: float
    steps: int
    batch_size: int
    duration_s: float  # expected alone: start-up + first steps' extra cost + steps at the solo rate
    peak_mib: float
    sm_activity: float
    dram_activity: float
    profile_source: str  # "measured" or "assumed (...)"
    mem_source: str
    warmup_s: float = 0.0  # the first steps' extra cost, part of duration_s (0 in older files)

    def worker_args(self, device: str = "cuda") -> list[str]:
        """Arguments after ``python -m collocate.bench.worker`` (``--out`` is added at run time)."""
        return ["--workload", self.workload, "--steps", str(self.steps),
                "--batch-size", str(self.batch_size), "--device", device]


@dataclass(frozen=True, slots=True)
class Solo:
    steps_per_s: float
    startup_s: float
    first_steps_s: float  # the warm-up steps' time beyond the steady rate
    batch_size: int
    mem_mib: float | None
    sm: float | None
    dram: float | None


def solo_table(records: Sequence[dict[str, Any]]) -> dict[str, Solo]:
    """What the trace needs from each workload's alone run."""
    mem = solo_memory(records)
    out: dict[str, Solo] = {}
    for r in records:
        if r.get("sharing") != ALONE or r.get("status") != "ok" or not r.get("jobs"):
            continue
        job, gpu = r["jobs"][0], r.get("gpu", {})
        if not job.get("steps_per_s"):
            continue
        name = r["workloads"][0]
        measured = r.get("env", {}).get("measured_on") == "cuda"
        rate = float(job["steps_per_s"])
        first = float(job.get("warmup_s") or 0.0) - int(job.get("warmup_steps") or 0) / rate
        out[name] = Solo(rate, float(job.get("startup_s") or 0.0), max(0.0, first),
                         int(job["batch_size"]), mem.get(name),
                         gpu.get("sm_activity") if measured else None,
                         gpu.get("dram_activity") if measured else None)
    return out


def build_minitrace(records: Sequence[dict[str, Any]], *, n_jobs: int = 12, seed: int = 0,
                    mean_gap_s: float = DEFAULT_GAP_S, target_scale: float = 1.0,
                    workloads: Sequence[str] = DEFAULT_WORKLOADS) -> list[MiniJob]:
    """Seeded jobs: every available workload at least once, the rest drawn at random.

    ``target_scale`` shrinks (or stretches) every job's target training time, to fit the replay
    into the GPU time at hand; arrivals keep their own scale (``mean_gap_s``).
    """
    if n_jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {n_jobs}")
    if target_scale <= 0 or mean_gap_s < 0:
        raise InputError("--target-scale must be > 0 and --gap >= 0")
    solo = solo_table(records)
    pool = [w for w in workloads if w in solo]
    if not pool:
        raise InputError("the results file has no successful alone run of the chosen workloads",
                         hint="run `collocate bench run` with copies 1 first (alone runs)")
    rng = np.random.default_rng(seed)
    names = list(pool[:n_jobs]) + [pool[i] for i in rng.integers(0, len(pool), max(0, n_jobs - len(pool)))]
    names = [names[i] for i in rng.permutation(len(names))]
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(mean_gap_s, n_jobs - 1))])
    from collocate.sim.trace import assumed_profile

    jobs = []
    for k, (name, arrival) in enumerate(zip(names, arrivals, strict=True)):
        spec, s = workload(name), solo[name]
        lo, hi = TARGET_S[spec.size]
        target = float(rng.uniform(lo, hi)) * target_scale
        steps = max(1, round(target * s.steps_per_s))
        if s.sm is not None and s.dram is not None:
            sm, dram, psrc = s.sm, s.dram, "measured"
        else:
            p = assumed_profile(spec.family)
            sm, dram = p.sm_activity, p.dram_activity
            psrc = "assumed (data/workload_profiles.toml; no GPU measurement)"
        mem, msrc = (s.mem_mib, "measured") if s.mem_mib else (UNKNOWN_MEM_MIB, "assumed")
        jobs.append(MiniJob(
            id=f"j{k + 1:02d}", name=f"{name}-{k + 1:02d}", workload=name,
            arrival_s=round(float(arrival), 2), steps=steps, batch_size=s.batch_size,
            duration_s=round(s.startup_s + s.first_steps_s + steps / s.steps_per_s, 2),
            peak_mib=float(math.ceil(mem)), sm_activity=round(float(sm), 4),
            dram_activity=round(float(dram), 4), profile_source=psrc, mem_source=msrc,
            warmup_s=round(s.first_steps_s, 2)))
    return jobs


def write_trace_csv(jobs: Sequence[MiniJob], path: Path) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=TRACE_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for j in jobs:
            writer.writerow({**asdict(j), "gpus": 1})
    return path


def write_jobs_json(jobs: Sequence[MiniJob], path: Path, *, env: dict[str, Any], source: str,
                    seed: int) -> Path:
    doc: dict[str, Any] = {"source": source, "seed": seed, "env": env,
                           "jobs": [asdict(j) for j in jobs]}
    if env.get("measured_on") != "cuda":
        doc["note"] = CPU_TRACE_NOTE
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def read_jobs_json(path: Path) -> tuple[list[MiniJob], dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
        return [MiniJob(**j) for j in doc["jobs"]], doc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read mini-trace jobs from {path}: {exc}",
                         hint="make it with `collocate bench minitrace build`") from None


def submit_script(jobs: Sequence[MiniJob]) -> str:
    """A bash script that submits the jobs at their arrival times to a running daemon."""
    lines = [
        "#!/usr/bin/env bash",
        "# Submit the mini-trace to a running daemon, e.g. started with",
        "#   collocate serve --gpus nvml --policy carma-magm --sharing mps --state-dir \"$STATE\"",
        "# Generated by `collocate bench minitrace build`; `collocate bench minitrace run` does the",
        "# same and also samples the GPU and collects the results.",
        "set -euo pipefail",
        'STATE="${STATE:-${COLLOCATE_STATE_DIR:-$HOME/.local/state/collocate}}"',
        'RESULTS="${RESULTS:-$PWD/minitrace-results}"',
        'PY="${PYTHON:-python3}"',
        'mkdir -p "$RESULTS"',
    ]
    last = 0.0
    for j in jobs:
        gap = j.arrival_s - last
        if gap > 0:
            lines.append(f"sleep {gap:.2f}")
        last = j.arrival_s
        worker = " ".join(shlex.quote(a) for a in j.worker_args())
        lines.append(
            f'collocate submit --state-dir "$STATE" --mem {int(j.peak_mib)}MiB '
            f"--name {shlex.quote(j.name)} -- \"$PY\" -m collocate.bench.worker {worker} "
            f'--out "$RESULTS/{j.id}.json"')
    lines.append('echo "submitted {n} jobs; watch with: collocate ls --all --state-dir $STATE"'
                 .replace("{n}", str(len(jobs))))
    return "\n".join(lines) + "\n"


def build_files(records: Sequence[dict[str, Any]], out_dir: Path, *, source: str,
                n_jobs: int = 12, seed: int = 0, mean_gap_s: float = DEFAULT_GAP_S,
                target_scale: float = 1.0) -> list[Path]:
    """trace.csv, jobs.json and submit.sh in ``out_dir``."""
    jobs = build_minitrace(records, n_jobs=n_jobs, seed=seed, mean_gap_s=mean_gap_s,
                           target_scale=target_scale)
    out_dir.mkdir(parents=True, exist_ok=True)
    script = out_dir / "submit.sh"
    script.write_text(submit_script(jobs))
    script.chmod(0o755)
    return [write_trace_csv(jobs, out_dir / "trace.csv"),
            write_jobs_json(jobs, out_dir / "jobs.json", env=env_of(records), source=source,
                            seed=seed),
            script]
