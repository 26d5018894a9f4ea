"""Read-only views the API returns: job rows, a job's detail with attempts, GPUs, log chunks.

Plain dicts of JSON types, so the client renders them as a table or prints them as JSON and
other tools can consume ``collocate ls --format json`` directly.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collocate.common.errors import InputError
from collocate.core.model import Job, JobState, Wait
from collocate.daemon.store import Store
from collocate.node.files import attempt_files
from collocate.wire.protocol import PAGE_ROWS

if TYPE_CHECKING:
    from collocate.daemon.gpu_watch import GpuWatch
    from collocate.wire.spec import JobSpec

LOG_CHUNK_BYTES = 256 * 1024


#: Reads a chunk of an attempt's log on the node of one of its parts:
#: ``(attempt, "stdout"|"stderr", offset, limit, rank) -> bytes``.
LogReader = Callable[[Any, str, int, int, int], bytes]

#: Why a pending job waits (``Scheduler.why_waiting``, or the drain), by job id.
Waiting = Callable[[str], Wait | None]


ROW_REASON_CHARS = 500  # a reason in ``ls`` rows (``show`` gives it whole): pages stay small


def job_rows(store: Store, *, include_done: bool, running: Mapping[str, Any],
             waiting: Waiting = lambda job_id: None, order: Sequence[str] = (),
             now: float | None = None, after: int = 0, limit: int = PAGE_ROWS,
             ids: list[str] | None = None) -> list[dict[str, Any]]:
    """One page of ``ls`` (the jobs after job ``after``; ``client.job_pages`` reads them all),
    one row per job as ``squeue`` and ``sacct`` give them: ``position`` in the queue (``order``:
    pending ids in queue order), ``elapsed_s`` of the current or last run, ``wait_s`` from
    submission to first start (so far, while pending), the last attempt's GPUs and exit code, the
    time limit and whether it is held."""
    now = time.time() if now is None else now
    page = store.jobs_page(after=after, limit=limit, active=not include_done, ids=ids)
    runs: dict[str, list[tuple]] = {}
    for job_id, start, end, gpus, returncode in store.db.execute(
        "SELECT job_id, start, end, gpus, returncode FROM attempts"
        " WHERE job_id IN (SELECT value FROM json_each(?)) ORDER BY job_id, n",
        (json.dumps([job.id for job, _, _ in page]),)
    ):
        runs.setdefault(job_id, []).append((start, end, gpus, returncode))
    position = {job_id: i for i, job_id in enumerate(order, start=1)}
    rows = []
    for job, spec, ended in page:
        mine = runs.get(job.id, [])
        first, last = (mine[0], mine[-1]) if mine else (None, None)
        started = first[0] if first else None
        elapsed = None
        if last is not None and (job.state is JobState.RUNNING or job.state.is_terminal):
            elapsed = (last[1] if last[1] is not None else now) - last[0]
        reason = _reason(job, running, waiting)
        if reason["reason"] and len(reason["reason"]) > ROW_REASON_CHARS:  # `show` has it whole
            reason["reason"] = reason["reason"][:ROW_REASON_CHARS - 1] + "…"
        rows.append({
            "id": job.id, "name": job.name, "state": job.state.value, "user": spec.user,
            "gpus": job.gpus, "mem_mib": job.mem_mib, "mem_source": job.mem_source,
            "priority": job.priority, "attempts": job.attempts, "oom_crashes": job.oom_crashes,
            "submit_time": job.submit_time, "start_time": started, "end_time": ended,
            "on": json.loads(last[2]) if last and (job.id in running or job.state.is_terminal) else [],
            "position": position.get(job.id), "elapsed_s": elapsed,
            "wait_s": (started if started is not None else (ended or now)) - job.submit_time,
            "exit_code": last[3] if last and job.state.is_terminal else None,
            "time_limit_s": job.time_limit_s, "held": job.held, "public": spec.public,
            "nodes": job.nodes, "frozen_s": None if elapsed is None else frozen_s(job, now),
            **reason, **_suspension(job, running.get(job.id)),
        })
    return rows


def frozen_s(job: Job, now: float) -> float:
    """Seconds its current (or last) attempt spent frozen, a freeze still on included: its
    ``--time`` does not count them, nor does ``ls``'s TIME (squeue's time used)."""
    ongoing = now - job.suspended_at if job.suspended and job.suspended_at is not None else 0.0
    return job.frozen_s + max(0.0, ongoing)


def _suspension(job: Job, run: Any = None) -> dict[str, Any]:
    """A frozen job's who, since when and why (``collocate.core.suspension``); its reason says it,
    why first (``ls`` at 80 columns shows the first words: "for job 12 …", "slowed job 3 …"),
    and, for one frozen before it launched (``run``: its attempt, waiting for its dataset's
    producer), that it has not started."""
    if not job.suspended:
        return {"suspended": ""}
    since = time.strftime("%H:%M:%S", time.localtime(job.suspended_at or 0.0))
    unstarted = "; not started yet: it starts once thawed" if getattr(run, "waiting", None) else ""
    return {"suspended": job.suspended, "suspended_at": job.suspended_at, "suspended_why": job.suspended_why,
            "reason": f"{job.suspended_why}{' ' if job.suspended_why.startswith('suspended ') else '; suspended '}"
                      f"since {since}{unstarted}"}


def _reason(job: Job, running: Mapping[str, Any], waiting: Waiting) -> dict[str, Any]:
    """``reason``: why a pending job waits (``wait`` is its kind), why a placed job has not
    launched yet, or the stored reason (rejected, failed, last requeued). Waits are not stored:
    they change every round, and a restarted daemon works them out again."""
    wait = waiting(job.id) if job.state is JobState.PENDING else None
    if wait is not None:
        return {"reason": str(wait), "wait": wait.kind.value}
    run = running.get(job.id)
    return {"reason": getattr(run, "why_waiting", None) or job.reason, "wait": None}


def job_detail(store: Store, job_id: str, *, running: Mapping[str, Any] | None = None,
               waiting: Waiting = lambda job_id: None,
               resident: Callable[[str], Any] | None = None) -> dict[str, Any]:
    found = store.job(job_id)
    if found is None:
        raise InputError(f"no job {job_id!r}")
    job, spec, ended = found
    return {
        "id": job.id, "name": job.name, "state": job.state.value,
        **_reason(job, running or {}, waiting),
        "user": spec.user, "argv": list(spec.argv), "cwd": spec.cwd, "gpus": job.gpus,
        "mem_mib": job.mem_mib, "mem_source": job.mem_source, "priority": job.priority,
        "max_retries": job.max_retries, "attempts_used": job.attempts,
        "oom_crashes": job.oom_crashes, "submit_time": job.submit_time, "end_time": ended,
        "identity": spec.keys.identity, "after": list(job.after), "after_any": list(job.after_any),
        "after_notok": list(job.after_notok), "time_limit_s": job.time_limit_s,
        "held": job.held, "public": spec.public, "notify": list(spec.notify),
        "retry_failures": job.retry_failures, "nodes": job.nodes, **_suspension(job, (running or {}).get(job.id)),
        **_measured(job, store.attempts(job_id), resident(job_id) if resident else None),
        "fence": fence_line(job, resident(job_id) if resident else None),
        "victim_crashes": job.victim_crashes, "sweep": job.sweep, "sweep_max": job.sweep_max,
        **_output_files(job, spec),
    }


def _output_files(job: Job, spec: JobSpec) -> dict[str, str]:
    """The ``--output``/``--error`` files as the job's attempts write them (its owner's to see)."""
    from collocate.wire.outputs import fill

    names = {"job_id": job.id, "name": job.name, "user": spec.user or job.user, "sweep": job.sweep}
    return {key: fill(template, **names) for key, template in (("output", spec.output), ("error", spec.error))
            if template is not None}


def fence_line(job: Job, r: Any) -> str:
    """Whether the job's memory is fenced (its running attempt's, else its last or next one's),
    at what, and if not, why (``collocate.core.recovery``)."""
    from collocate.common.units import format_mib
    from collocate.core.recovery import job_fence_mib, why_unfenced

    live = job.state is JobState.RUNNING and r is not None
    placed = r.job if live else job
    why = why_unfenced(placed)
    if why:
        return f"not fenced: {why}"
    fence = job_fence_mib(placed, r.room_mib if live else None)
    if fence is None and live:  # placed with no room at all (a policy that ignores memory)
        return "not fenced: no memory was given and its GPU had no room left when it started"
    if fence is None:
        # "no memory was given", never "unknown": `show` prints its measured peak beside this
        had = "had when it started" if job.state.is_terminal else "has when it starts"
        return f"fenced at the room its GPU {had} (no memory was given)"
    return (f"fenced at {format_mib(fence)} per GPU (a PyTorch job's caching allocator is capped "
            "there; under MPS its memory limit)")


def _measured(job: Job, attempts: list[Any], resident: Any) -> dict[str, Any]:
    """``profile`` and ``attempts`` as ``show`` gives them, so that what was measured wins
    over what was assumed: a running attempt's ``peak_mib`` is its peak so far (the world's
    memory ramp; ``peak_so_far`` says so) rather than nothing beside the summary's peak, and an
    ended job shows the solo activity one of its attempts measured, not the prior it started
    with (assumed, its family's or an earlier run's)."""
    rows = [a.to_dict() for a in attempts]
    if rows and rows[-1]["end"] is None and rows[-1]["peak_mib"] is None and resident is not None:
        peak = getattr(getattr(resident, "ramp", None), "peak_mib", 0.0) or 0.0
        if peak > 0:
            rows[-1]["peak_mib"], rows[-1]["peak_so_far"] = peak, True
    profile = _profile(job, resident)
    solo = next((a for a in reversed(attempts) if a.solo_sm is not None), None)
    if resident is None and profile["source_kind"] not in ("measured", "inferred") and solo is not None:
        profile.update(sm_activity=solo.solo_sm, dram_activity=solo.solo_dram or 0.0, sm_sd=None,
                       source_kind="measured",
                       source=f"measured on its GPU in attempt {solo.n}, alone at least once")
    return {"profile": profile, "attempts": rows}


_SOURCES = {
    "measured": "measured on its GPU in this attempt, alone at least once",
    "inferred": "inferred from the readings of the GPU it shares, in this attempt",
    "history": "learned in earlier runs of the same job",
    "similar": "its family's runs (the same script and non-numeric arguments), shrunk toward the prior",
    "assumed": "assumed: nothing observed",
}


def _profile(job: Job, resident: Any) -> dict[str, Any]:
    """The solo activity the policies use for this job, how sure it is, and where it comes
    from (``collocate.core.belief``): the world's belief while it runs, else what it was told."""
    if resident is not None:
        belief = resident.pricing
        sm, dram, sm_var, source = (belief.profile.sm_activity, belief.profile.dram_activity,
                                    belief.sm_var, belief.source)
    else:
        sm, dram, source = job.profile.sm_activity, job.profile.dram_activity, job.profile_source
        sm_var = job.profile_var[0] if job.profile_var else None
    return {"sm_activity": sm, "dram_activity": dram, "sm_sd": None if sm_var is None else sm_var ** 0.5,
            "source": _SOURCES.get(source, source), "source_kind": source,
            # from the steps it reports (``log_metric(..., step=)``): its fastest rate over its rate now
            "measured_slowdown": (resident.slowdown or None) if resident is not None else None}


def purged_key(job_id: str) -> str:
    """The store flag ``collocate purge`` sets on a job whose logs it removed."""
    return f"purged:{job_id}"


def logs(store: Store, job_id: str, args: Mapping[str, Any], read: LogReader,
         waiting: Waiting = lambda job_id: None) -> dict[str, Any]:
    """A chunk of one attempt's stdout or stderr from ``offset``; the client follows with it.

    ``attempts`` summarises every attempt (number, outcome, reason, memory it was placed with,
    ended or not), so a follower can move on to the next attempt and say why it started.
    ``read`` is the fleet's ``read_log``: the file lives on the node that ran the attempt (a
    job on several nodes: each part's on its node; ``node`` picks one, rank 0's by default)."""
    attempts = store.attempts(job_id)
    found = store.job(job_id)
    state = found[0].state.value if found else "unknown"
    if attempts and store.get_flag(purged_key(job_id)):  # `collocate purge` removed the files
        return {"text": "", "offset": 0, "attempt": attempts[-1].n, "state": state, "reason": "",
                "path": None, "ended": True, "attempts": [], "purged": True}
    wait = waiting(job_id) if found and found[0].state is JobState.PENDING else None
    reason = str(wait) if wait is not None else (found[0].reason if found else "")
    summary = [{"n": a.n, "outcome": a.outcome, "reason": a.reason, "mem_mib": a.mem_mib,
                "ended": a.end is not None} for a in attempts]
    if not attempts:
        return {"text": "", "offset": 0, "attempt": None, "state": state, "reason": reason,
                "path": None, "ended": False, "attempts": []}
    n = args.get("attempt")
    matching = attempts[-1:] if n is None else [a for a in attempts if a.n == int(n)]
    chosen = matching[0] if matching else None
    if chosen is None:
        raise InputError(f"job {job_id} has no attempt {n}", hint=f"it has 1..{attempts[-1].n}")
    stream = "stderr" if args.get("stream") == "stderr" else "stdout"
    path = attempt_files(Path(chosen.dir))[stream]
    offset = max(0, int(args.get("offset", 0)))
    rank = 0
    if args.get("node") is not None:
        node = str(args["node"])
        if node not in chosen.nodes:
            raise InputError(f"attempt {chosen.n} of job {job_id} did not run on node {node!r}",
                             hint=f"its nodes: {', '.join(chosen.nodes)}")
        rank = chosen.nodes.index(node)
    # read after the attempt rows: an attempt seen ended has all its output in the file
    data = read(chosen, stream, offset, LOG_CHUNK_BYTES, rank)
    if not (chosen.end is not None and len(data) < LOG_CHUNK_BYTES):  # more may follow
        data = complete_utf8(data)
    return {"text": data.decode(errors="replace"), "offset": offset + len(data),
            "attempt": chosen.n, "state": state, "reason": reason, "path": os.fspath(path),
            "ended": chosen.end is not None, "attempts": summary, "nodes": list(chosen.nodes),
            "node": chosen.nodes[rank] if chosen.nodes else None}


def notify_logs(folder: Path, stream: str, offset: int) -> dict[str, Any]:
    """A chunk of a job's ``--notify`` output (``collocate logs ID --notify``): the files its
    runner's log keeper wrote under ``folder`` (``daemon.notify.notify_dir``), on the head."""
    path = attempt_files(folder)["stderr" if stream == "stderr" else "stdout"]
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(LOG_CHUNK_BYTES)
    except OSError:
        data = b""
    ended = (folder / "exit.json").exists()
    if not (ended and len(data) < LOG_CHUNK_BYTES):
        data = complete_utf8(data)
    return {"text": data.decode(errors="replace"), "offset": offset + len(data),
            "started": folder.is_dir(), "ended": ended}


def complete_utf8(data: bytes) -> bytes:
    """``data`` without a multi-byte UTF-8 character cut off at its end: those bytes start the
    next chunk, so a character split across two reads is not shown as two replacement marks."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 == 0x80:
            continue  # a continuation byte: the character starts further back
        size = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        return data if back >= size else data[:-back]
    return data


def committed_by_gpu(monitor: GpuWatch) -> dict[str, float]:
    """MiB the running jobs commit on each GPU, by uuid (the world model's,
    ``collocate.core.commitment``)."""
    return {d.uuid: monitor.committed_mib(d.uuid) for d in monitor.devices}


def gpu_rows(monitor: GpuWatch, running: Mapping[str, Any], now: float,
             events: Sequence[tuple[float, str, str]] = ()) -> list[dict[str, Any]]:
    """Each GPU: its reading (now, the risk window's summary, and ``sm_recent``: its SM
    averaged over the last few samples, what a start on trial asks), its jobs, the memory they
    commit (``collocate.core.commitment``), the memory of processes that are no job's
    (``other_mib``), how many of its jobs the scheduler froze (``frozen``: it holds their room,
    ``suspension.holds_room``) and, on a cluster, the latest change of its node's membership within
    ``EVENT_S`` (joined, stopped answering, answers again)."""
    latest = {node: (at, what) for at, node, what in events if now - at < EVENT_S}
    jobs_on: dict[str, list[str]] = {}
    for job_id, run in running.items():
        for uuid in run.attempt.uuids:
            jobs_on.setdefault(uuid, []).append(job_id)
    held = {uuid: {j: _held_mib(running[j].pids, monitor.last.get(uuid)) for j in ids}
            for uuid, ids in jobs_on.items()}
    owner = {pid: job_id for job_id, run in running.items() for pid in run.pids}
    rows = []
    for d in monitor.devices:
        s = monitor.last.get(d.uuid)
        u = monitor.util(d.uuid)
        rows.append({
            "id": str(d.id), "node": d.id.node, "reachable": s is None or s.reachable,
            "uuid": d.uuid, "type": d.type_name, "total_mib": d.total_mib,
            "used_mib": None if s is None else s.used_mib,
            "free_mib": None if s is None else s.free_mib,
            "sm_now": None if s is None else s.sm_activity,
            "sm_window": u.sm_activity, "dram_window": u.dram_activity,
            "sm_recent": monitor.world.recent_sm(monitor.position[d.uuid], now),
            "committed_mib": monitor.committed_mib(d.uuid),
            "other_mib": monitor.other_mib.get(d.uuid, 0.0),
            "slowed": monitor.world.slowed(monitor.position[d.uuid]) or None,
            "frozen": monitor.world.n_frozen(monitor.position[d.uuid]),  # held for their thaw
            "jobs": sorted(jobs_on.get(d.uuid, []), key=int),
            "job_mib": held.get(d.uuid, {}),
            "node_event": latest.get(d.id.node),
            **device_readings(s, owner),
        })
    return rows


def device_readings(sample: Any, owner: Mapping[int, str]) -> dict[str, Any]:
    """What nvidia-smi shows of a GPU beside memory: power (W), temperature (C), SM and memory
    clocks (MHz), each None where the backend cannot read it (emulated GPUs model power, not
    temperature or clocks), and every process holding memory on it with the job it belongs to
    (``owner``: pid -> job id; None for a process that is no job's)."""
    if sample is None:
        return {"power_w": None, "temperature_c": None, "sm_clock_mhz": None,
                "mem_clock_mhz": None, "processes": []}
    return {"power_w": sample.power_watts, "temperature_c": getattr(sample, "temperature_c", None),
            "sm_clock_mhz": getattr(sample, "sm_clock_mhz", None),
            "mem_clock_mhz": getattr(sample, "mem_clock_mhz", None),
            "processes": [{"pid": p.pid, "used_mib": p.used_mib, "job": owner.get(p.pid)}
                          for p in sample.processes]}


EVENT_S = 3600.0  # how long ``collocate gpus`` shows that a node joined, left or came back


def _held_mib(pids: frozenset[int], sample: Any) -> float | None:
    """What a job's processes hold on the GPU in its latest sample (measured, not declared)."""
    if sample is None:
        return None
    return sum(p.used_mib for p in sample.processes if p.pid in pids)


_cpu_primed = False


def host_usage() -> dict[str, Any]:
    """The daemon's host as the page shows it (and ``htop``): CPU busy since the last call (None
    on the first, which has nothing to compare with), cores, load, and RAM used of total."""
    import psutil

    global _cpu_primed
    cpu = psutil.cpu_percent(interval=None)
    known, _cpu_primed = _cpu_primed, True
    mem = psutil.virtual_memory()
    return {"cpu_pct": cpu if known else None, "cpus": psutil.cpu_count() or 1,
            "load1": os.getloadavg()[0], "mem_total_mib": mem.total / 2**20,
            "mem_used_mib": (mem.total - mem.available) / 2**20}
