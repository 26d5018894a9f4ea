"""Priority preemption by suspension (issue 35, Slurm's PreemptMode=SUSPEND): the pure rule
(``collocate.core.preemption``) on the world's snapshots, the scheduler's record of it, the thaw when
the preemptor ends, and the simulator carrying it out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.gputypes import parse_cluster
from collocate.core.interference import default_interference
from collocate.core.model import GpuId, Job, JobProfile, JobState, SharingMode
from collocate.core.policies import make_policy
from collocate.core.preemption import preempt
from collocate.core.recovery import ExitReport, Outcome
from collocate.core.scheduler import Capacity, Scheduler
from collocate.core.world import Device, World
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

GIB = 1024.0
TS = default_interference().modes[SharingMode.TIME_SLICING]


class Lab:
    """A scheduler and the world it places into, as both worlds wire them."""

    def __init__(self, gpus: int = 1, policy: str = "exclusive", gib: float = 80.0) -> None:
        self.world = World([Device(GpuId("n", i), gib * GIB) for i in range(gpus)],
                           sharing=SharingMode.TIME_SLICING, params=TS)
        self.s = Scheduler(make_policy(policy), Capacity.of(self.world.snapshot(0.0)))

    def round(self, now: float):
        plan = self.s.schedule(self.world.snapshot(now), lambda idle: self.world.snapshot(now, idle))
        for f in plan.freeze:
            self.world.freeze(f.job_id, now, True)
        for p in plan.placements:
            self.world.place(self.s.jobs[p.job_id], [self.world.index[g] for g in p.gpus], now)
        return plan

    def run(self, job: Job, now: float):
        """Submit ``job`` and run a round."""
        self.s.submit(job)
        return self.round(now)

    def end(self, job_id: str, now: float):
        self.s.job_exited(job_id, ExitReport(Outcome.SUCCEEDED), now)
        self.world.remove(job_id, now)
        return self.s.review(self.world.neighbourhood, now)


def job(job_id: str, gib: float = 20.0, priority: int = 0, **kw) -> Job:
    return Job(job_id, mem_mib=gib * GIB, mem_source="declared", priority=priority, **kw)


def test_a_job_of_higher_priority_freezes_a_lower_one_starts_beside_it_and_thaws_it_when_it_ends():
    lab = Lab()
    lab.run(job("low"), 0.0)
    assert lab.s.jobs["low"].state is JobState.RUNNING
    plan = lab.run(job("high", priority=5), 10.0)
    assert [p.job_id for p in plan.placements] == ["high"]
    assert [(f.job_id, f.by) for f in plan.freeze] == [("low", "preempt")]
    low = lab.s.jobs["low"]
    assert low.state is JobState.RUNNING and low.suspended == "preempt" and low.suspended_at == 10.0
    assert low.suspended_why == "for job high of higher priority (5 > 0); thaws when it ends"
    assert lab.s.reviewing
    # while the preemptor runs, the frozen job stays frozen
    assert not lab.s.review(lab.world.neighbourhood, 50.0)
    decided = lab.end("high", 60.0)
    assert decided.thaw == ("low",) and not lab.s.jobs["low"].suspended
    assert lab.s.jobs["low"].frozen_s == 50.0  # its --time did not run while frozen


def test_preemption_frees_compute_never_memory():
    lab = Lab(gib=80.0)
    lab.run(job("low", 40.0), 0.0)
    # 50 GiB does not fit beside the 40 GiB the frozen job keeps: it waits, whatever its priority
    plan = lab.run(job("high", 50.0, priority=5), 10.0)
    assert not plan.placements and not plan.freeze and not lab.s.jobs["low"].suspended
    assert lab.s.jobs["high"].state is JobState.PENDING
    # 30 GiB does: it starts, and the GPU holds both jobs' memory
    lab.s.cancel("high")
    plan = lab.run(job("high2", 30.0, priority=5), 20.0)
    assert [p.job_id for p in plan.placements] == ["high2"] and lab.s.jobs["low"].suspended == "preempt"
    assert lab.world.committed_mib(0) <= 80.0 * GIB


def test_equal_priority_interactive_across_nodes_or_suspended_jobs_are_never_frozen():
    for running, pending in ((job("a"), job("b")),  # equal priority: fair share, not preemption
                             (job("a", interactive=True), job("b", priority=5)),
                             (job("a", priority=5), job("b", priority=5))):
        lab = Lab()
        lab.run(running, 0.0)
        plan = lab.run(pending, 10.0)
        assert not plan.freeze and not plan.placements, (running, pending)
    lab = Lab()
    lab.run(job("a"), 0.0)
    lab.s.suspend("a", "user", 5.0, why="suspended by its owner")
    assert not lab.run(job("b", priority=5), 10.0).freeze  # never frozen twice
    assert lab.s.jobs["a"].suspended == "user"
    lab = Lab(gpus=2)  # a job across nodes: a frozen rank stalls the others
    lab.world = World([Device(GpuId(n, 0), 80 * GIB) for n in ("x", "y")], sharing=SharingMode.TIME_SLICING,
                      params=TS)
    lab.s = Scheduler(make_policy("exclusive"), Capacity.of(lab.world.snapshot(0.0)))
    lab.run(job("wide", nodes=2), 0.0)
    assert lab.s.jobs["wide"].state is JobState.RUNNING
    assert not lab.run(job("b", priority=5), 10.0).freeze


def test_the_lowest_priority_is_frozen_first_and_no_more_than_needed():
    lab = Lab(gpus=3)
    for name, prio in (("p-1", -1), ("p-5", -5), ("p-3", -3)):
        lab.run(job(name, priority=prio), 0.0)
    plan = lab.run(job("high"), 10.0)
    assert [f.job_id for f in plan.freeze] == ["p-5"]
    assert [lab.s.jobs[j].suspended for j in ("p-1", "p-5", "p-3")] == ["", "preempt", ""]
    # a second job of the default priority takes the next lowest
    plan = lab.run(job("high2"), 20.0)
    assert [f.job_id for f in plan.freeze] == ["p-3"]
    # when the preemptor is frozen itself (its owner), the one frozen for it thaws
    lab.s.suspend("high", "user", 30.0)
    assert lab.s.review(lab.world.neighbourhood, 30.0).thaw == ("p-5",)


def test_a_restored_preempted_job_thaws_by_the_same_rule():
    lab = Lab()
    lab.run(job("low"), 0.0)
    lab.run(job("high", priority=5), 10.0)
    saved = list(lab.s.jobs.values())
    again = Scheduler(make_policy("exclusive"), Capacity.of(lab.world.snapshot(0.0)))
    again.restore(saved)  # a daemon restarted
    assert again.reviewing and again.jobs["low"].suspended == "preempt"
    assert not again.overdue(10**6)
    again.job_exited("high", ExitReport(Outcome.SUCCEEDED), 40.0)
    assert again.review(lab.world.neighbourhood, 40.0).thaw == ("low",)


SEEN: list[int] = []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-3, 3), st.floats(5.0, 60.0), st.booleans()),
                min_size=1, max_size=6),
       st.integers(-2, 4), st.floats(5.0, 70.0))
def test_preemption_never_overcommits_memory_and_freezes_only_lower_priorities(residents, prio, gib):
    """Under ``shares`` (up to 2 jobs per GPU) with random residents: whatever is frozen has a
    lower priority and may be frozen, sits on the preemptor's GPU, and the GPU's memory holds
    every job's commitment; if a GPU holds only freezable lower jobs and memory fits, it starts."""
    lab = Lab(gpus=3, policy="shares")
    for k, (gpu, p, mem, interactive) in enumerate(residents):
        lab.s.submit(job(f"r{k}", mem, p, interactive=interactive))
        snapshot = lab.world.snapshot(0.0)
        placed = next(iter(make_policy("shares")([lab.s.jobs[f"r{k}"]], snapshot.subset([gpu])).placements), None)
        if placed is None:
            lab.s.cancel(f"r{k}")
            continue
        lab.s._store(lab.s.jobs[f"r{k}"].evolve(state=JobState.RUNNING, started_at=float(k)))  # placed by hand
        lab.world.place(lab.s.jobs[f"r{k}"], [gpu], 0.0)
    high = job("high", gib, prio)
    lab.s.submit(high)
    before = {j.id: j for j in lab.s.jobs.values()}
    cluster = lab.world.snapshot(10.0)
    found = preempt(high, [j for j in before.values() if j.state is JobState.RUNNING], make_policy("shares"),
                    cluster, lambda idle: lab.world.snapshot(10.0, idle))
    if found is None:
        # completeness: when every GPU is full, one with a freezable lower job and room would do
        full = all(len(cluster.residents[i]) == 2 for i in range(3))
        for i in range(3) if full else ():
            on = [before[j] for j in cluster.residents[i]]
            if (any(j.priority < prio and not j.interactive for j in on)
                    and 80 * GIB - sum(j.mem_mib for j in on) >= gib * GIB):
                raise AssertionError(f"GPU {i} could take it by freezing one of {[j.id for j in on]}")
        return
    SEEN.append(len(found.freeze))
    gpu = lab.world.index[found.placement.gpus[0]]
    assert found.freeze
    for f in found.freeze:
        frozen = before[f.job_id]
        assert frozen.priority < prio and not frozen.interactive and not frozen.suspended
        assert f.job_id in cluster.residents[gpu]
    assert cluster.committed_mib[gpu] + gib * GIB <= cluster.total_mib[gpu]


def test_the_simulator_freezes_a_lower_job_for_a_higher_one_and_every_job_ends_done():
    # exclusive: `low` (300 s) holds the only GPU; `high` (priority 5, 100 s) arrives at 30 s,
    # freezes it, runs, ends; `low` thaws and finishes about 100 s late, its work intact
    w = Workload("w", 1, 300.0, 8000.0, {"declared": 8192.0}, JobProfile(0.5, 0.3), command="w", program="w")
    short = Workload("s", 1, 100.0, 8000.0, {"declared": 8192.0}, JobProfile(0.5, 0.3), command="s", program="s")
    trace = [TraceJob("low", 0.0, w), TraceJob("high", 30.0, short, priority=5)]
    sim = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("exclusive"),
                     SimConfig(estimator="declared", ramp_s=2.0, startup_s=5.0))
    result = sim.run()
    records = {r.id: r for r in result.records}
    assert all(r.state == "done" for r in records.values())
    assert records["high"].start == 30.0 and records["high"].end < 30.0 + 100.0 * 1.1
    assert 95.0 <= result.frozen_seconds <= 115.0  # `low` was frozen while `high` ran
    assert records["low"].end >= 300.0 + 95.0 and records["low"].end >= records["high"].end
    # without priorities the same trace waits in order: `high` starts when `low` ends
    plain = Simulation(parse_cluster("1xH100-80GB"), [trace[0], TraceJob("high", 30.0, short)],
                       make_policy("exclusive"), SimConfig(estimator="declared", ramp_s=2.0, startup_s=5.0)).run()
    assert plain.frozen_seconds == 0.0 and {r.id: r for r in plain.records}["high"].start >= 300.0
    # nor with preemption off (``serve``/``simulate --no-preemption``): priority only orders the queue
    off = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("exclusive"),
                     SimConfig(estimator="declared", ramp_s=2.0, startup_s=5.0, preemption=False)).run()
    assert off.frozen_seconds == 0.0 and {r.id: r for r in off.records}["high"].start >= 300.0


def test_a_recovered_job_of_low_priority_at_the_head_does_not_hide_a_higher_one_behind_it():
    lab = Lab()
    lab.run(job("low"), 0.0)
    lab.s.submit(job("again", priority=-5, oom_crashes=1))  # recovered: first in its user's queue
    plan = lab.run(job("high", priority=5), 10.0)
    assert [j.id for j in lab.s.queue] == ["again"] and [p.job_id for p in plan.placements] == ["high"]
    assert [f.job_id for f in plan.freeze] == ["low"]


def test_under_auto_a_higher_job_the_slowdown_gate_turns_away_freezes_the_lower_one():
    lab = Lab(policy="auto")
    heavy = {"profile": JobProfile(0.9, 0.8), "profile_source": "history"}
    lab.run(job("low", **heavy), 0.0)
    plan = lab.run(job("peer", **heavy), 10.0)  # of the same priority: it waits, the gate says why
    assert not plan.placements and lab.s.waits["peer"].kind.value == "slowdown"
    lab.s.cancel("peer")
    plan = lab.run(job("high", priority=5, **heavy), 20.0)
    assert [p.job_id for p in plan.placements] == ["high"] and [f.job_id for f in plan.freeze] == ["low"]


def test_simulate_no_preemption_lets_the_higher_job_wait(tmp_path):
    from typer.testing import CliRunner

    from collocate.cli import app

    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival_s,gpus,duration_s,peak_mib,sm_activity,priority\n"
                     "low,0,1,300,8000,0.5,0\nhigh,30,1,100,8000,0.5,5\n")
    starts = {}
    for flag in ("--preemption", "--no-preemption"):
        args = ["simulate", "--trace", str(trace), "--cluster", "1xH100-80GB", "--policy", "exclusive",
                "--format", "json", "--out", str(tmp_path / flag)]
        out = CliRunner().invoke(app, args + ([flag] if flag == "--no-preemption" else []))
        assert out.exit_code == 0, out.output
        rows = [line.split(",") for line in (tmp_path / flag / "jobs.csv").read_text().splitlines()]
        starts[flag] = {r[1]: float(r[5]) for r in rows[1:]}
    assert starts["--preemption"]["high"] == 30.0  # it froze `low` and started at once
    assert starts["--no-preemption"]["high"] == 300.0  # it waited for `low` to end
