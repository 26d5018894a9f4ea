"""Job traces and the workload catalogue: reading, validating, and turning rows into jobs.

Two input formats, both documented in docs/simulator.md:

* CSV with a header. Either CARMA's short form ``index, arrival_s, workload`` (a name looked up
  in a workload catalogue), or self-contained rows with ``id, arrival_s, gpus, duration_s,
  peak_mib`` and optional ``mem_estimate_mib, sm_activity, dram_activity, warmup_s, startup_s,
  name``, and ``nodes`` (a job on several nodes, ``gpus`` on each).
  A row may mix both: explicit columns override the catalogue.
* JSON Lines: one object per line with the same keys.

Every problem is reported with the file, the line and the field, and nothing is half-loaded.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from collocate.common.errors import InputError
from collocate.core.model import PRIORITY_MAX, JobProfile

ESTIMATORS = ("peak", "horus", "faketensor", "gpumemnet")


@dataclass(frozen=True, slots=True)
class Workload:
    """One job type: what it needs and how it behaves alone."""

    name: str
    gpus: int
    duration_s: float  # solo runtime
    peak_mib: float  # measured peak memory (what really gets allocated)
    estimates: dict[str, float] = field(default_factory=dict)  # estimator name -> MiB
    profile: JobProfile = JobProfile()
    # Seconds of duration_s, after start-up, in which the job is on its GPUs but barely uses them
    # (cuDNN autotuning, lazy kernel loading, compilation). Measured on an H100: 2-5 s per CNN,
    # under 1 s for a transformer or DLRM (docs/gpu-validation.md section 5).
    warmup_s: float = 0.0
    # Seconds of duration_s from launch until the job's process holds memory on its GPUs
    # (interpreter, imports, model construction: 4-10 s on an H100); None: the simulation's
    # ``SimConfig.startup_s``.
    startup_s: float | None = None
    # What stands for the job's command in the daemon's history (jobs with the same command
    # share a measured profile): the catalogue workload it comes from; None for a job described
    # inline, which shares its command with no other.
    command: str | None = None
    # What stands for its program (script and working directory: a sweep's points share it):
    # the catalogue's model and dataset, whose rows differ only in batch size. None inline.
    program: str | None = None
    # How many nodes it runs on, ``gpus`` on each (a data-parallel job across servers; placed
    # as a gang by the same rule as the daemon's ``submit --nodes``).
    nodes: int = 1


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    arrival_s: float
    workload: Workload
    user: str = ""  # who submitted it (a trace's optional ``user`` column): fair share counts by it
    #: Its priority (the optional ``priority`` column, a whole number, higher first; 0 when
    #: empty): the queue's first key, and a higher one freezes lower ones (``collocate.core.preemption``).
    priority: int = 0


def _priority(value: str | float | int | None, where: str) -> int:
    """A trace's ``priority``: a whole number (negative allowed, as ``--nice`` gives), 0 when empty."""
    if value is None or str(value).strip() == "":
        return 0
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number) or abs(number) > PRIORITY_MAX:
        raise InputError(f"{where}: 'priority' must be a whole number within +/-{PRIORITY_MAX:,}, got {value!r}")
    return int(number)


def _number(value: str | float | int | None, where: str, column: str, *, integer: bool = False) -> float:
    if value is None or value == "":
        raise InputError(f"{where}: missing value for {column!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {column!r} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{where}: {column!r} must be a finite number >= 0, got {value!r}")
    if integer and number != int(number):
        raise InputError(f"{where}: {column!r} must be a whole number, got {value!r}")
    return number


@cache
def _assumed_profiles() -> dict:
    text = resources.files("collocate").joinpath("data/workload_profiles.toml").read_text()
    return tomllib.loads(text)


def assumed_profile(model: str, dataset: str = "") -> JobProfile:
    """SM/DRAM activity assumed for a model family (see data/workload_profiles.toml)."""
    doc = _assumed_profiles()
    base = doc["models"].get(model)
    if base is None:
        return JobProfile()
    scale = doc["datasets"].get(dataset, {}).get("scale", 1.0)
    level = doc.get("level", {})
    if model not in level.get("measured", ()):
        scale *= level.get("scale", 1.0)  # the A100 level of CARMA's published runs
    return JobProfile(round(base["sm"] * scale, 4), round(base["dram"] * scale, 4))


def _workload_profile(name: str) -> JobProfile | None:
    """A catalogue row's profile derived from a measurement, if it has one (data/workload_profiles.toml)."""
    row = _assumed_profiles().get("workloads", {}).get(name)
    return None if row is None else JobProfile(row["sm"], row["dram"])


def load_catalogue(path: Path) -> dict[str, Workload]:
    """Read a workload catalogue in the format of ``carma-workloads.csv``."""
    required = ("name", "gpus", "epoch_minutes", "epochs", "peak_mib")
    catalogue: dict[str, Workload] = {}
    for where, row in _csv_rows(path, required):
        name = row["name"].strip()
        if name in catalogue:
            raise InputError(f"{where}: workload {name!r} is listed twice")
        estimates = {"peak": _number(row["peak_mib"], where, "peak_mib")}
        for column in ("horus", "faketensor", "gpumemnet"):
            if row.get(f"{column}_mib"):
                estimates[column] = _number(row[f"{column}_mib"], where, f"{column}_mib")
        minutes = _number(row["epoch_minutes"], where, "epoch_minutes") * _number(
            row["epochs"], where, "epochs"
        )
        catalogue[name] = Workload(
            name=name,
            gpus=_gpus(row["gpus"], where),
            duration_s=minutes * 60.0,
            peak_mib=estimates["peak"],
            estimates=estimates,
            profile=_workload_profile(name) or assumed_profile(row.get("model", ""), row.get("dataset", "")),
            program=f"{row['model']}|{row.get('dataset', '')}" if row.get("model") else None,
        )
    return catalogue


def load_trace(path: Path, catalogue: dict[str, Workload] | None = None) -> list[TraceJob]:
    """Read a CSV or JSONL trace; arrival times must be sorted and ids unique."""
    if path.suffix in (".jsonl", ".ndjson"):
        rows = _jsonl_rows(path)
    else:
        rows = _csv_rows(path, ("arrival_s",))
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    last_arrival = 0.0
    for number, (where, row) in enumerate(rows, start=1):
        job_id = str(row.get("id") or row.get("index") or number).strip()
        if job_id in seen:
            raise InputError(f"{where}: job id {job_id!r} appears twice", hint="ids must be unique")
        seen.add(job_id)
        arrival = _number(row.get("arrival_s"), where, "arrival_s")
        if arrival < last_arrival:
            raise InputError(
                f"{where}: arrival_s {arrival:g} is earlier than the previous row's {last_arrival:g}",
                hint="sort the trace by arrival_s",
            )
        last_arrival = arrival
        jobs.append(TraceJob(job_id, arrival, _workload(row, where, catalogue),
                             str(row.get("user") or "").strip(), _priority(row.get("priority"), where)))
    if not jobs:
        raise InputError(f"{path}: the trace has no jobs")
    return jobs


def _workload(row: dict, where: str, catalogue: dict[str, Workload] | None) -> Workload:
    name = str(row.get("workload") or "").strip()
    if name:
        if catalogue is None:
            raise InputError(
                f"{where}: row names workload {name!r} but no catalogue was given",
                hint="pass --workloads FILE (e.g. carma-workloads.csv)",
            )
        if name not in catalogue:
            raise InputError(
                f"{where}: unknown workload {name!r}",
                hint=f"it is not in the catalogue ({len(catalogue)} workloads); check the spelling",
            )
        base = catalogue[name]
    else:
        missing = [c for c in ("gpus", "duration_s", "peak_mib") if row.get(c) in (None, "")]
        if missing:
            raise InputError(
                f"{where}: missing column(s) {', '.join(missing)}",
                hint="give a `workload` from the catalogue, or gpus, duration_s and peak_mib",
            )
        base = Workload(name=str(row.get("name") or "job"), gpus=1, duration_s=0.0, peak_mib=0.0)
    gpus = _gpus(row["gpus"], where) if row.get("gpus") not in (None, "") else base.gpus
    peak = _number_or(row, "peak_mib", where, base.peak_mib)
    duration = _number_or(row, "duration_s", where, base.duration_s)
    estimates = dict(base.estimates) | {"peak": peak}
    if row.get("mem_estimate_mib") not in (None, ""):
        estimates["declared"] = _number(row["mem_estimate_mib"], where, "mem_estimate_mib")
    profile = base.profile
    if row.get("sm_activity") not in (None, "") or row.get("dram_activity") not in (None, ""):
        profile = JobProfile(
            _fraction(row.get("sm_activity"), where, "sm_activity", profile.sm_activity),
            _fraction(row.get("dram_activity"), where, "dram_activity", profile.dram_activity),
        )
    warmup = _number_or(row, "warmup_s", where, base.warmup_s)
    startup = None if row.get("startup_s") in (None, "") else _number(row["startup_s"], where, "startup_s")
    if warmup + (startup or 0.0) > duration:
        raise InputError(f"{where}: startup_s and warmup_s ({warmup + (startup or 0.0):g} s) are longer "
                         f"than duration_s {duration:g}",
                         hint="start-up and warm-up are the idle start of the job's duration, not extra time")
    nodes = 1
    if row.get("nodes") not in (None, ""):
        nodes = int(_number(row["nodes"], where, "nodes", integer=True))
        if nodes < 1:
            raise InputError(f"{where}: 'nodes' must be at least 1")
    return Workload(str(row.get("name") or base.name), gpus, duration, peak, estimates, profile,
                    warmup, startup, command=name or None, program=base.program if name else None,
                    nodes=nodes)


def _number_or(row: dict, column: str, where: str, default: float) -> float:
    """The row's value of ``column``, or ``default`` (the catalogue's) where the cell is empty."""
    return default if row.get(column) in (None, "") else _number(row[column], where, column)


def _gpus(value: str | int, where: str) -> int:
    gpus = int(_number(value, where, "gpus", integer=True))
    if gpus < 0:
        raise InputError(f"{where}: 'gpus' must be 0 (a CPU job: it runs on no GPU) or more")
    return gpus


def _fraction(value, where: str, column: str, default: float) -> float:
    if value in (None, ""):
        return default
    number = _number(value, where, column)
    if number > 1:
        raise InputError(f"{where}: {column!r} is a fraction in [0, 1], got {value!r}")
    return number


def _csv_rows(path: Path, required: tuple[str, ...]):
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(
                f"{path}:1: header lacks column(s) {', '.join(missing)}",
                hint=f"the header is: {', '.join(header) or '(empty)'}",
            )
        rows = []
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row:
                raise InputError(f"{where}: more fields than the header has columns")
            rows.append((where, row))
    return rows


def _jsonl_rows(path: Path):
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: each line must be a JSON object")
        rows.append((where, row))
    return rows
