"""What a job nobody has measured pays for the start-up slot, and what its neighbours pay without it.

    PYTHONPATH=src python benchmarks/startup_trade.py [--data ../shared/data] [--out PATH]

Issue 35 asks that a job whose memory fits start when a GPU's *measured* load leaves room,
whatever the model guesses about it, and that the daemon take back (freeze) one that then slows a
neighbour past the limit. ``auto`` holds a job priced only by a prior to one start-up slot per
GPU (``startup_slots``, ``observe_slots``): on a GPU where another job is still starting it waits,
because the readings do not show the starting job yet. This script runs the variants of that
rule side by side through the simulator (the same world and policy code as the daemon; what a
fresh daemon knows: ``profiles="unknown"``) on traces not designed for it:

* ``mix``: ``plain_queue.py``'s seeded mix (54 jobs and 4 CPU jobs over a minute, and the probe
  ``sleep 1 --mem 1GiB`` half-way; 4xA100-40GB), seeds 35-37, under MPS (the daemon's default for
  one user) and time-slicing. The simulator does not model memory that grows late: a job's peak
  is reached after its ramp, so under-declared jobs crash (and recover) early, not late;
* ``first-run``: ``first_run.py``'s trace (14 jobs at once on one H100-80GB), both modes;
* ``synthetic``: ``collocate.sim.synth`` traces of ``auto_family.py``'s small-b (90 jobs,
  4xA100-40GB, load 1.2, seeds 200-201) and small-e (100 jobs, 2x(4xH100-80GB), load 1.3, seeds
  500-501), with 8-s start-ups (gpu-facts.md: 4-10 s), time-slicing;
* ``carma``: carma-heavy-60 and carma-mix-90 with 8-s start-ups, time-slicing (read, never tuned to).

Per trace and variant: makespan over ``exclusive``'s on the same trace, start waits (p50, max,
how many started more than 5 s after submission), the probe's completion time, and job by job
each job's completion time over its time under ``exclusive`` (p50, p95, max, jobs worse off:
``collocate.sim.metrics.versus_exclusive``). Variants (the start-up bound of
``collocate.core.world.STARTUP_MAX_S`` is switched off for "before" by setting it to infinity; "warming
frees the slot" counts only jobs with no GPU memory yet as starting, a rule of the world tried
here by recounting the snapshot's ``n_starting``; "pile-up taken back at once" freezes as many
trial jobs of a GPU at once as the limit needs, ``SuspendRules.at_once``, where the others freeze
one per GPU per ``settle_s``; "frozen room" keeps a GPU holding a job the scheduler froze from
unpriced starts, ``Auto.frozen_room``; "reading alone" lets the gate read the GPU's load without
what is known of its jobs, ``Auto.observe_known``; "thaw one" freezes the trial job that came last
in the queue and thaws one per GPU at a time, the first, ``SuspendRules.thaw_one``). ``--variant
NAME`` runs only the named ones. Deterministic, CPU only, a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import collocate.core.world as world_module
from collocate.core.gputypes import parse_cluster
from collocate.core.model import JobProfile, SharingMode
from collocate.core.policies import make_policy
from collocate.core.policies.auto import Auto
from collocate.core.suspension import SuspendRules
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import completion_times, versus_exclusive
from collocate.sim.synth import synthetic_trace
from collocate.sim.trace import TraceJob, Workload, load_catalogue, load_trace

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from first_run import sim_trace  # noqa: E402
from first_run_trace import TRACE  # noqa: E402
from plain_queue import make_mix  # noqa: E402

START_S = 5.0  # issue 35: a job that fits starts within this


@dataclass(frozen=True)
class SeenVouch(Auto):
    """A variant tried here, not in ``auto``: on a GPU reading measured room, an unpriced job
    may start while fewer of its jobs are still starting than have been seen working (at least
    one slot): the reading vouches for room as far as it has seen the GPU's jobs."""

    def _may_start_unpriced(self, job, ledger, candidates, min_gain):
        by_model, on_room = super()._may_start_unpriced(job, ledger, candidates, min_gain)
        if job.profile_source not in ("assumed", "similar") or min_gain != self.min_gain:
            return by_model, on_room  # a job that never starts past the gate
        starting = ledger.n_starting[candidates]
        seen = ledger.n_jobs[candidates] - starting
        load = ledger.cluster.util_sm if ledger.cluster.sm_recent is None else ledger.cluster.sm_recent
        on_room = ((load[candidates] < self.observe_below_sm) & (starting < np.maximum(1, seen))
                   & (job.nodes == 1 and not job.interactive))
        return by_model, on_room


#: name -> (start-up bound on, auto's parameters, warming frees the slot); an ``at_once`` parameter
#: takes a pile-up of trial jobs back in one step (``SuspendRules.at_once``), where every other
#: variant freezes one job per GPU per settling period (the default); a ``thaw_one`` parameter
#: freezes the trial job that came last in the queue and thaws, per GPU, the one that came first,
#: one per settling period (``SuspendRules.thaw_one``)
VARIANTS: dict[str, tuple[bool, dict, bool]] = {
    "defaults, thaw one": (True, {"thaw_one": True}, False),
    "observe_slots=2": (True, {"observe_slots": 2}, False),
    "observe_slots=2, thaw one": (True, {"observe_slots": 2, "thaw_one": True}, False),
    "observe_slots=99, thaw one": (True, {"observe_slots": 99, "thaw_one": True}, False),
    "observe_slots=99, at once, thaw one": (True, {"observe_slots": 99, "at_once": True, "thaw_one": True}, False),
    "observe_slots=99, at once, frozen room, thaw one": (
        True, {"observe_slots": 99, "at_once": True, "frozen_room": True, "thaw_one": True}, False),
    "defaults (one freeze per GPU per settle)": (True, {}, False),
    "reading alone (observe_known=False, the rule before)": (True, {"observe_known": False}, False),
    "defaults, pile-up taken back at once": (True, {"at_once": True}, False),
    "observe_slots=99": (True, {"observe_slots": 99}, False),
    "observe_slots=99, pile-up taken back at once": (True, {"observe_slots": 99, "at_once": True}, False),
    "observe_slots=99, at once, frozen room": (True, {"observe_slots": 99, "at_once": True, "frozen_room": True}, False),
    "observe_slots=99, frozen room": (True, {"observe_slots": 99, "frozen_room": True}, False),
    "defaults, frozen room": (True, {"frozen_room": True}, False),
    "defaults, frozen room, thaw one": (True, {"frozen_room": True, "thaw_one": True}, False),
    "observe_slots=2, at once, frozen room": (True, {"observe_slots": 2, "at_once": True, "frozen_room": True}, False),
    "before (no start-up bound)": (False, {}, False),
    "start-up bound (60 s)": (True, {}, False),
    "bound, warming frees the slot": (True, {}, True),
    "bound, observe_slots=2": (True, {"observe_slots": 2}, False),
    "bound, warming frees the slot, observe_slots=2": (True, {"observe_slots": 2}, True),
    "bound, measured room: fewer starting than seen (SeenVouch)": (True, {"seen_vouch": True}, False),
    "bound, measured room needs no slot (observe_slots=99)": (True, {"observe_slots": 99}, False),
    "bound, startup_slots=99 (no slot at all)": (True, {"startup_slots": 99, "observe_slots": 99}, False),
}


def mix_trace(seed: int) -> list[TraceJob]:
    """``plain_queue.py``'s mix as a simulator trace (see the module docstring)."""
    out = []
    for j in make_mix(seed=seed):
        if j.kind == "cpu":
            w = Workload(j.name, 0, j.seconds, 0.0)
        elif j.kind == "probe":  # ``sleep 1``: never holds GPU memory
            w = Workload(j.name, 1, j.seconds, 1.0, {"declared": j.declared_mib}, JobProfile(0.0, 0.0),
                         startup_s=j.seconds, command="sleep 1")
        else:
            estimates = {} if j.declared_mib is None else {"declared": j.declared_mib}
            w = Workload(j.name, 1, j.seconds, j.need_mib, estimates, JobProfile(j.sm, j.dram),
                         warmup_s=j.warmup_s, startup_s=j.startup_s, command=j.name)
        out.append(TraceJob(j.name, j.arrival_s, w))
    return out


def cases(data: Path) -> list[tuple[str, str, str, list[TraceJob], SimConfig]]:
    """(family, label, cluster, trace, config) of every case."""
    out = []
    for seed in (35, 36, 37):
        for mode in ("mps", "time-slicing"):
            out.append(("mix", f"mix seed {seed} {mode}", "4xA100-40GB", mix_trace(seed),
                        SimConfig(sharing=SharingMode(mode), estimator="declared", profiles="unknown", ramp_s=2.0)))
    for mode in ("mps", "time-slicing"):
        out.append(("first-run", f"first-run {mode}", "1xH100-80GB", sim_trace(TRACE, 1.0),
                    SimConfig(sharing=SharingMode(mode), estimator="declared", profiles="unknown", ramp_s=2.0)))
    for jobs, cluster, seed, load in ((90, "4xA100-40GB", 200, 1.2), (90, "4xA100-40GB", 201, 1.2),
                                      (100, "2x(4xH100-80GB)", 500, 1.3), (100, "2x(4xH100-80GB)", 501, 1.3)):
        nodes = parse_cluster(cluster)
        trace = synthetic_trace(jobs, gpus=sum(n.count for n in nodes), gpu_mem_mib=min(n.gpu_type.memory_mib for n in nodes),
                                max_gpus_per_job=max(n.count for n in nodes), seed=seed, load=load)
        out.append(("synthetic", f"{jobs} jobs {cluster} seed {seed}", cluster, trace,
                    SimConfig(profiles="unknown", startup_s=8.0)))
    catalogue = load_catalogue(data / "carma-workloads.csv")
    for name in ("carma-heavy-60", "carma-mix-90"):
        out.append(("carma", name, "4xA100-40GB", load_trace(data / f"{name}.csv", catalogue),
                    SimConfig(profiles="unknown", startup_s=8.0)))
    return out


@contextlib.contextmanager
def variant_world(bound: bool, warming_frees: bool) -> Iterator[None]:
    """The world with the start-up bound on or off, counting warming jobs as starting or not."""
    saved_bound, saved_snapshot = world_module.STARTUP_MAX_S, world_module.World.snapshot
    if not bound:
        world_module.STARTUP_MAX_S = math.inf
    if warming_frees:
        def snapshot(self, now, idle=()):
            snap = saved_snapshot(self, now, idle)
            n = np.zeros(len(self.ids), dtype=np.int64)
            for r in self.residents.values():
                if r.phase is world_module.Phase.STARTING and r.starting:
                    n[list(r.devices)] += 1
            return snap.evolve(n_starting=n)
        world_module.World.snapshot = snapshot
    try:
        yield
    finally:
        world_module.STARTUP_MAX_S, world_module.World.snapshot = saved_bound, saved_snapshot


def measure(result, exclusive) -> dict:
    versus, _ = versus_exclusive(completion_times(result), completion_times(exclusive))
    waits = np.array([r.start - r.submit for r in result.records if r.start is not None and r.gpus > 0])
    probe = next((r for r in result.records if r.id == "probe"), None)
    return {
        "makespan_ratio": round(result.makespan_s / exclusive.makespan_s, 3),
        "wait_p50_s": round(float(np.percentile(waits, 50)), 1), "wait_max_s": round(float(waits.max()), 1),
        "started_after_5s": int((waits > START_S).sum()), "jobs": int(waits.size),
        "probe_done_s": None if probe is None or probe.end is None else round(probe.end - probe.submit, 1),
        "p50": versus.p50, "p95": versus.p95, "max": versus.max, "worse": versus.worse,
        "oom_crashes": sum(r.oom_crashes for r in result.records),
    }


def run(data: Path, families: list[str] | None = None, variants: list[str] | None = None) -> dict:
    rows = []
    for family, label, cluster, trace, config in cases(data):
        if families and family not in families:
            continue
        nodes = parse_cluster(cluster)
        t0 = time.monotonic()
        exclusive = Simulation(nodes, trace, make_policy("exclusive"), config).run()
        row = {"family": family, "trace": label, "variants": {}}
        for name, (bound, params, warming_frees) in VARIANTS.items():
            if variants and name not in variants:
                continue
            params = dict(params)
            rules = SuspendRules(preempt=config.preemption, at_once=params.pop("at_once", False),
                                 thaw_one=params.pop("thaw_one", False))
            with variant_world(bound, warming_frees):
                policy = SeenVouch() if params.pop("seen_vouch", False) else make_policy("auto", **params)
                sim = Simulation(nodes, trace, policy, config)
                sim.scheduler.suspend_rules = rules
                result = sim.run()
            row["variants"][name] = measure(result, exclusive)
        rows.append(row)
        print(f"{label}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"rows": rows, "summary": summary(rows)}


def summary(rows: list[dict]) -> dict:
    """Per family and variant: geometric mean makespan ratio, mean p95 and worst max ratio, total
    jobs worse off and started after 5 s, and the probe's completion (mix only)."""
    out: dict = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        out[family] = {}
        for name in dict.fromkeys(n for r in mine for n in r["variants"]):
            v = [r["variants"][name] for r in mine]
            probes = [x["probe_done_s"] for x in v if x["probe_done_s"] is not None]
            out[family][name] = {
                "makespan_ratio": round(math.exp(statistics.fmean(math.log(x["makespan_ratio"]) for x in v)), 3),
                "p95": round(statistics.fmean(x["p95"] for x in v), 3), "max": max(x["max"] for x in v),
                "worse": sum(x["worse"] for x in v), "started_after_5s": sum(x["started_after_5s"] for x in v),
                "jobs": sum(x["jobs"] for x in v), "wait_p50_s": round(statistics.fmean(x["wait_p50_s"] for x in v), 1),
                "probe_done_s": round(max(probes), 1) if probes else None,
            }
    return out


def report(doc: dict) -> str:
    lines = ["# The start-up slot against trial starts: `auto` variants side by side (simulator)", "",
             f"`python benchmarks/startup_trade.py`; {doc['machine']['host_cpu']}, {doc['machine']['cores']} cores, "
             f"load average {doc['load']}; {doc['seconds']:.0f} s. What a fresh "
             "daemon knows (`profiles=\"unknown\"`); each trace's `exclusive` run is the baseline.", "",
             "Per family: makespan over exclusive (geometric mean), p50 start wait (mean over traces), jobs started "
             "> 5 s after submission (of all GPU jobs), probe `sleep 1 --mem 1GiB` completion (worst over the mix "
             "traces), completion over exclusive p95 (mean over traces) / max (worst), jobs worse off (> 1.05x, total).", ""]
    for family, variants in doc["summary"].items():
        lines += [f"## {family}", "", "| variant | makespan | wait p50 | started > 5 s | probe | p95 / max | worse |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, s in variants.items():
            probe = "" if s["probe_done_s"] is None else f"{s['probe_done_s']} s"
            lines.append(f"| {name} | {s['makespan_ratio']}x | {s['wait_p50_s']} s | {s['started_after_5s']} / {s['jobs']} "
                         f"| {probe} | {s['p95']} / {s['max']} | {s['worse']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent.parent / "shared" / "data",
                        help="the CARMA traces and workload catalogue (default: ../shared/data)")
    parser.add_argument("--family", action="append", choices=("mix", "first-run", "synthetic", "carma"),
                        help="only these families (default: all)")
    parser.add_argument("--variant", action="append", choices=tuple(VARIANTS), metavar="NAME",
                        help="only these variants (default: all)")
    parser.add_argument("--out", type=Path, help="write <out>.json and <out>.md (default benchmarks/results/)")
    args = parser.parse_args()
    from _machine import machine

    t0, load = time.monotonic(), os.getloadavg()[0]
    doc = run(args.data, args.family, args.variant)
    doc["machine"] = machine()
    doc["load"] = f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    doc["seconds"] = time.monotonic() - t0
    out = args.out or ROOT / "results" / f"startup_trade-{time.strftime('%Y-%m-%d')}"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(doc) + "\n")
    print(report(doc))


if __name__ == "__main__":
    main()
