"""One small trace through the real daemon (emulated GPUs) and through the simulator, and what
the two worlds did with it side by side: the helpers of ``test_parity`` and ``test_parity_cases``.

A trace is a list of ``TraceRun`` (numbered from 1 in submission order). The daemon runs it
first; a run submitted after another has started or ended (``after``) arrives in the simulator
when it arrived in the daemon. What the simulator cannot know is what a real process costs the
machine around its job (``test_parity``'s docstring): order and sharing are compared with the
simulator told a quiet machine's cost (``SPAWN_S``), makespans with it told each job's own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from daemon_harness import Daemon, job_argv, wait_for

from collocate.core.gputypes import parse_cluster
from collocate.core.model import JobProfile, SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, SimResult, Simulation
from collocate.sim.trace import TraceJob, Workload

MEM_MIB = 4000.0
STARTUP_S = 1.0  # the job's own start-up (``--startup``)
SPAWN_S = 0.5  # about what a job.py process costs around its job on a quiet machine
PERIOD_S = 0.1  # the test daemons' sampling period (conftest)
TOLERANCE = 0.25  # makespans agree within 25 % (the daemon's period and rounds, readings' timing)

#: job id → (start, end, GPU indices) of its last attempt, seconds from the first submission
Spans = dict[str, tuple[float, float, frozenset[str]]]
#: job id → its freezes (start, end), seconds from the first submission
Freezes = dict[str, list[tuple[float, float]]]


@dataclass(frozen=True)
class TraceRun:
    """One job of a parity trace: an emulated job that starts up for ``startup_s``, then works
    ``seconds`` alone at this activity, holding ``mem_mib`` (reached over the trace's ramp)."""

    sm: float
    dram: float
    seconds: float
    mem_mib: float = MEM_MIB
    declared_mib: float | None = None  # what it declares (``submit --mem``); None: ``mem_mib``
    gpus: int = 1
    after: tuple[str, str] | None = None  # (job, state): submitted once that job is in that state
    startup_s: float = STARTUP_S

    def argv(self, ramp_s: float) -> list[str]:
        ramp = ("--ramp", str(ramp_s)) if ramp_s else ()
        return job_argv(self.mem_mib, self.seconds + self.startup_s, None, self.sm, "--dram", str(self.dram),
                        "--startup", str(self.startup_s), *ramp)


@dataclass
class DaemonRun:
    """What the daemon did with a trace."""

    spans: Spans
    frozen: Freezes
    makespan: float
    arrivals: dict[str, float]
    spawn: dict[str, float]  # each job's last attempt's process cost
    details: dict[str, dict]  # ``show`` of each job at the end
    told: dict[str, str]  # the activity's source each job was priced from when it was submitted
    log: str


def run_daemon(d: Daemon, runs: list[TraceRun], ramp_s: float = 0.0, timeout: float = 120.0) -> DaemonRun:
    """Submit the trace to a started daemon and wait for every job to be done."""
    ids: list[str] = []
    told: dict[str, str] = {}

    def priced() -> None:  # asked once a batch is in, so that jobs submitted together arrive together
        told.update({j: d.job(j)["profile"]["source_kind"] for j in ids if j not in told})

    for run in runs:
        if run.after is not None:
            priced()
            d.wait_state(*run.after, timeout=timeout)
        ids.append(d.submit(run.argv(ramp_s), mem=f"{run.declared_mib or run.mem_mib:.0f}MiB", gpus=run.gpus))
    priced()
    assert ids == [str(k + 1) for k in range(len(runs))], ids
    rows = wait_for(lambda: (r := d.client.request("ls", all=True)) and all(x["state"] == "done" for x in r) and r,
                    timeout, "every job done")
    details = {j: d.job(j) for j in ids}
    first = min(r["submit_time"] for r in rows)
    spans = {j: (a["start"] - first, a["end"] - first, _indices(a["gpus"]))
             for j, dt in details.items() for a in dt["attempts"][-1:]}
    log = (d.state_dir / "daemon.log").read_text()
    return DaemonRun(spans, daemon_freezes(log, first), max(r["end_time"] for r in rows) - first,
                     {r["id"]: r["submit_time"] - first for r in rows},
                     {j: process_cost(dt["attempts"][-1]) for j, dt in details.items()}, details, told, log)


def _indices(gpus) -> frozenset[str]:
    """A job's GPUs as their indices ("local:1" and "n0:1" are both "1", "local:0/2.0" and
    "n0:0/2.0" both "0/2.0": a MIG instance)."""
    return frozenset(str(g).rsplit(":", 1)[-1] for g in gpus)


def sim_trace(runs: list[TraceRun], arrivals: dict[str, float] | None = None,
              spawn: dict[str, float] | None = None, ramp_s: float = 0.0) -> list[TraceJob]:
    """The jobs as the simulator sees them: arriving when the daemon took them (``arrivals``,
    else all at 0), with each job's process cost (``spawn``, else ``SPAWN_S``) before its own
    start-up, with no GPU use. A job's command is its argv (the daemon's history key for these
    jobs) and every job is one program (job.py: the daemon's family)."""
    trace = []
    for k, run in enumerate(runs):
        job = str(k + 1)
        startup = run.startup_s + (spawn or {}).get(job, SPAWN_S)
        trace.append(TraceJob(job, (arrivals or {}).get(job, 0.0), Workload(
            f"j{job}", run.gpus, run.seconds + startup, run.mem_mib, {"declared": run.declared_mib or run.mem_mib},
            JobProfile(run.sm, run.dram), startup_s=startup, command=" ".join(run.argv(ramp_s)),
            program="job.py")))
    return trace


def simulate(trace: list[TraceJob], policy: str, sharing: str, gpus: str = "1xA100-40GB", ramp_s: float = 0.0,
             profiles: str = "unknown", mig_layout: str | None = None) -> tuple[Simulation, SimResult]:
    """The simulator on ``gpus``, each split by ``mig_layout`` (``--mig-layout``) when given."""
    sim = Simulation(parse_cluster(gpus), trace, make_policy(policy),
                     SimConfig(sharing=SharingMode(sharing), estimator="declared", profiles=profiles,
                               ramp_s=ramp_s, period_s=PERIOD_S, mig_layout=mig_layout))
    return sim, sim.run()


def sim_spans(result: SimResult) -> Spans:
    """Each job's last attempt as the simulator ran it."""
    return {r.id: (r.spans[-1][1], r.end, _indices(r.last_gpus.split(","))) for r in result.records}


def sim_freezes(result: SimResult) -> Freezes:
    """Each job's freezes as the simulator recorded them (one still on at its end: to its end)."""
    return {r.id: [(s, r.end if e is None else e) for s, e in r.frozen] for r in result.records}


def daemon_freezes(log: str, first: float) -> Freezes:
    """Each job's freezes as the daemon carried them out (its log's "job N: frozen (…" and
    "thawed (…" lines, stamped to the millisecond in local time), from ``first``."""
    frozen: Freezes = {}
    for stamp, job, what in re.findall(r"^(\S+ \S+) INFO job (\d+): (frozen|thawed) \(", log, re.M):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() - first
        if what == "frozen":
            frozen.setdefault(job, []).append((at, math.inf))
        else:
            frozen[job][-1] = (frozen[job][-1][0], at)
    return frozen


def counted_s(attempt: dict) -> float:
    """The seconds the emulated job counted on its own clock from its first line of work to its
    end (its ``done in``): start-up, work, frozen time."""
    out = (Path(attempt["dir"]) / "stdout.log").read_text()
    counted = re.search(r"done in ([0-9.]+)s", out)
    assert counted, out
    return float(counted.group(1))


def process_cost(attempt: dict) -> float:
    """What the attempt's process cost around its job: its wall span less the seconds the
    emulated job counted itself (start-up, work, frozen time: all the simulator models)."""
    return attempt["end"] - attempt["start"] - counted_s(attempt)


def running(span: tuple[float, float, frozenset[str]], frozen: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The stretches of a job's run it spent unfrozen: its span less its freezes."""
    stretches, at = [], span[0]
    for s, e in sorted(frozen):
        if s > at:
            stretches.append((at, min(s, span[1])))
        at = max(at, e)
    return stretches + ([(at, span[1])] if at < span[1] else [])


def shares(spans: Spans, frozen: Freezes) -> dict[str, frozenset[str]]:
    """Whom each job shared a GPU with: jobs on one of its GPUs that ran unfrozen beside it for
    more than 0.5 s in all (a job that starts as another ends shared nothing with it). A frozen
    job (``collocate.core.suspension``) shares nothing: it holds memory, not the GPU. Two heavy jobs
    kept apart are apart whether one waits queued or frozen, and which of them yields turns on
    when start-ups end (on a loaded machine the daemon may start the second heavy job in the
    round it starts a light one, and freeze the light one or the other heavy one instead);
    whether they ever run together is the decision the worlds must agree on."""
    runs = {job: running(span, frozen.get(job, [])) for job, span in spans.items()}

    def beside(a: str, b: str) -> float:
        return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in runs[a] for s2, e2 in runs[b])

    return {job: frozenset(o for o, (_, _, g) in spans.items() if o != job and g & gpus and beside(job, o) > 0.5)
            for job, (_, _, gpus) in spans.items()}


def order(spans: Spans) -> list[str]:
    return [job for job, _ in sorted(spans.items(), key=lambda kv: (kv[1][0], int(kv[0])))]


def shown(spans: Spans, other: Spans, spawn: dict[str, float], frozen: Freezes | None = None,
          other_frozen: Freezes | None = None) -> str:
    """Both worlds' spans (and freezes) side by side, one job a line: what a failure shows."""
    def freezes(f: Freezes | None, j: str) -> str:
        return "".join(f" frozen {s:.2f}-{e:.2f}" for s, e in (f or {}).get(j, []))

    def gpus(g: frozenset[str]) -> str:
        return ",".join(sorted(g))

    return "\n" + "\n".join(
        f"job {j}: daemon {spans[j][0]:6.2f}-{spans[j][1]:6.2f} gpu {gpus(spans[j][2])}{freezes(frozen, j)}  "
        f"simulator {other[j][0]:6.2f}-{other[j][1]:6.2f} gpu {gpus(other[j][2])}{freezes(other_frozen, j)}  "
        f"process cost {spawn[j]:.2f} s" for j in sorted(spans, key=int))
