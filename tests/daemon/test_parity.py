"""The project's central claim as a test: the same trace of emulated jobs through the real daemon
and through the simulator, with the same policy and sharing mode, shares GPUs the same way.

Both worlds run the one core (``Scheduler``, the policy, ``collocate.commitment``); what differs
is the clock, the GPUs (emulated processes vs simulated arrays) and the launcher. So the order in
which jobs start and who each job shares its GPU with at its start must agree, and makespans
agree within the start-up cost of real processes, which the simulator models as ``startup_s``.
The jobs' real activity equals the profile the daemon assumes for a job it knows nothing of
(0.5 SM / 0.2 DRAM), so what either world learns while they run changes no decision.
"""

from __future__ import annotations

import pytest
from daemon_harness import job_argv, wait_for

from collocate.gputypes import parse_cluster
from collocate.model import UNKNOWN_PROFILE, SharingMode
from collocate.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

SECONDS = (2.0, 3.0, 2.5, 4.0, 3.0, 2.0, 3.5)  # each job's time alone
MEM_MIB = 8000.0
STARTUP_S = 0.5  # about what a job.py process takes to show on its GPU on this machine
TOLERANCE = 0.25  # makespans agree within 25 % (process start-up, the daemon's 0.1 s period)


def _shares(spans: dict[str, tuple[float, float, str]]) -> dict[str, frozenset[str]]:
    """Whom each job shared its GPU with: jobs on the same GPU whose runs overlap its own by more
    than 0.3 s (a job that starts as another ends shared nothing with it)."""
    return {job: frozenset(o for o, (s, e, g) in spans.items()
                           if o != job and g == gpu and min(end, e) - max(start, s) > 0.3)
            for job, (start, end, gpu) in spans.items()}


def _order(spans: dict[str, tuple[float, float, str]]) -> list[list[str]]:
    """Jobs by start, those starting within 0.3 s of each other as one group (one round)."""
    groups: list[list[str]] = []
    last = None
    for job, (start, _, _) in sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0])):
        if last is None or start - last > 0.3:
            groups.append([])
        groups[-1].append(job)
        last = start
    return [sorted(g) for g in groups]


def _simulate(policy: str, sharing: str) -> tuple[dict, float]:
    trace = [TraceJob(str(k + 1), 0.0, Workload(f"j{k + 1}", 1, s + STARTUP_S, MEM_MIB,
                                                  {"declared": MEM_MIB}, UNKNOWN_PROFILE))
             for k, s in enumerate(SECONDS)]
    config = SimConfig(sharing=SharingMode(sharing), estimator="declared", profiles="unknown",
                       ramp_s=0.0, startup_s=STARTUP_S, learn_s=1.0)
    result = Simulation(parse_cluster("2xA100-40GB"), trace, make_policy(policy), config).run()
    spans = {r.id: (r.start, r.end, r.last_gpus.rsplit(":", 1)[-1]) for r in result.records}
    return spans, result.makespan_s


@pytest.mark.parametrize(("policy", "sharing"), [("exclusive", "time-slicing"), ("auto", "time-slicing"),
                                                 ("auto", "mps")])
def test_the_daemon_and_the_simulator_share_gpus_alike(daemons, policy, sharing):
    d = daemons("--policy", policy, "--sharing", sharing)  # 2 emulated A100-40GB, 0.1 s period
    jobs = [d.submit(job_argv(MEM_MIB, s, sm=UNKNOWN_PROFILE.sm_activity), mem=f"{MEM_MIB:.0f}MiB")
            for s in SECONDS]
    rows = wait_for(lambda: (r := d.client.request("ls", all=True)) and all(x["state"] == "done" for x in r) and r,
                    90, "every job done")
    details = {j: d.job(j) for j in jobs}
    first = min(r["submit_time"] for r in rows)
    spans = {j: (a["start"] - first, a["end"] - first, a["gpus"][0].rsplit(":", 1)[-1])
             for j, dt in details.items() for a in dt["attempts"][-1:]}
    makespan = max(r["end_time"] for r in rows) - first
    sim_spans, sim_makespan = _simulate(policy, sharing)
    assert _order(spans) == _order(sim_spans), (spans, sim_spans)
    assert _shares(spans) == _shares(sim_spans), (spans, sim_spans)
    assert sim_makespan == pytest.approx(makespan, rel=TOLERANCE)
