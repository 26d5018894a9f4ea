"""Start, observe, take back (issue 35): the pure freeze/thaw rule, the scheduler's record of
it (frozen time does not count against --time), and the simulator carrying it out."""

from __future__ import annotations

import pytest

from collocate.core.gputypes import parse_cluster
from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobProfile, JobState, Placement, Plan
from collocate.core.policies import make_policy
from collocate.core.scheduler import Capacity, Scheduler
from collocate.core.suspension import Neighbour, SuspendRules, review
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

GPU = GpuId("n", 0)
RULES = SuspendRules()
AT_ONCE = SuspendRules(at_once=True)


def _jobs(**extra: Job) -> dict[str, Job]:
    base = {"old": Job("old", state=JobState.RUNNING, started_at=0.0),
            "new": Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True)}
    return {**base, **extra}


def _around(old_slowdown: float, *, measured: bool = True, new_active: bool = True):
    views = [Neighbour("old", (0,), 1, True, old_slowdown, measured), Neighbour("new", (0,), 2, new_active, 1.0)]
    return lambda job_id: views


def test_a_job_on_trial_is_frozen_when_a_neighbour_is_seen_slowed_past_the_limit():
    decided = review(_jobs(), ["new"], _around(2.4), 100.0, RULES)
    assert [f.job_id for f in decided.freeze] == ["new"] and not decided.thaw
    assert "job old" in decided.freeze[0].why and "2.4x" in decided.freeze[0].why
    assert decided.freeze[0].beside == ("old",)
    # within the limit, or not seen working yet: it runs on
    assert not review(_jobs(), ["new"], _around(1.9), 100.0, RULES)
    assert not review(_jobs(), ["new"], _around(2.4, new_active=False), 100.0, RULES)


def test_only_jobs_on_trial_and_never_one_across_nodes_or_interactive_are_frozen():
    for job in (Job("new", state=JobState.RUNNING, started_at=50.0),
                Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, nodes=2),
                Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, interactive=True)):
        assert not review(_jobs(new=job), ["new"], _around(3.0), 100.0, RULES), job


def test_a_frozen_job_thaws_when_room_returns_and_is_not_frozen_again_at_once():
    frozen = Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, suspended="trial",
                 suspended_at=100.0, suspended_beside=("old",))
    # its neighbour still runs: it stays frozen, whatever the neighbour now measures
    assert not review(_jobs(new=frozen), ["new"], _around(1.0), 200.0, RULES)
    # its neighbour ended: thawed
    alone = [Neighbour("new", (0,), 2, False, 0.0)]
    assert review(_jobs(new=frozen), ["new"], lambda j: alone, 200.0, RULES).thaw == ("new",)
    # hysteresis: thawed at 200, it is not frozen again before 200 + settle_s
    thawed = Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, thawed_at=200.0)
    early = review(_jobs(new=thawed), ["new"], _around(3.0), 200.0 + RULES.settle_s / 2, RULES)
    assert not early and early.recheck_at == pytest.approx(200.0 + RULES.settle_s)
    assert review(_jobs(new=thawed), ["new"], _around(3.0), 200.0 + RULES.settle_s, RULES).freeze


def test_one_freeze_per_gpu_per_settling_period_the_newest_first():
    jobs = _jobs(newer=Job("newer", state=JobState.RUNNING, started_at=60.0, on_trial=True))
    views = [Neighbour("old", (0,), 1, True, 3.0, True), Neighbour("new", (0,), 2, True, 1.0),
             Neighbour("newer", (0,), 3, True, 1.0)]
    decided = review(jobs, ["new", "newer"], lambda j: views, 100.0, RULES)
    assert [f.job_id for f in decided.freeze] == ["newer"]


def _pile(old_slowdown: float = 5.0, **extra: Job):
    """``old`` beside four jobs started on trial at 10, 20, 30, 40 s, all seen working."""
    trial = {f"t{i}": Job(f"t{i}", state=JobState.RUNNING, started_at=10.0 * i, on_trial=True) for i in range(1, 5)}
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0), **trial, **extra}
    views = [Neighbour("old", (0,), 0, True, old_slowdown, True),
             *(Neighbour(j, (0,), i, True, 1.0) for i, j in enumerate(trial, 1))]
    return jobs, list(trial), lambda job_id: views


def test_a_pile_up_is_taken_back_at_once_the_newest_first_as_far_as_the_limit_needs():
    # old at 5x beside four working jobs: 1 + 4 x (its excess shared by the 4); with t4, t3,
    # t2 frozen it is estimated at 2x, within the limit: t1 runs on beside it
    jobs, watched, around = _pile(5.0)
    decided = review(jobs, watched, around, 100.0, AT_ONCE)
    assert [f.job_id for f in decided.freeze] == ["t4", "t3", "t2"]
    # each waits for room among the jobs that run on, not for the others frozen with it
    assert {f.beside for f in decided.freeze} == {("old", "t1")}
    assert "with the 2 newer frozen with it" in decided.freeze[-1].why
    # less slowed, fewer taken back; one job per GPU per settling period by default
    assert [f.job_id for f in review(jobs, watched, _pile(2.3)[2], 100.0, AT_ONCE).freeze] == ["t4"]
    assert [f.job_id for f in review(jobs, watched, around, 100.0, RULES).freeze] == ["t4"]


def test_a_pile_up_is_taken_back_past_jobs_never_frozen():
    # t3 interactive, t4 across nodes: never frozen; t2 and t1 are, and counted as left they
    # leave old at 1 + 4 x 2/4 = 3x, past the limit with nothing else to freeze
    jobs, watched, around = _pile(5.0, t3=Job("t3", state=JobState.RUNNING, started_at=30.0, on_trial=True,
                                            interactive=True),
                                  t4=Job("t4", state=JobState.RUNNING, started_at=40.0, on_trial=True, nodes=2))
    assert [f.job_id for f in review(jobs, watched, around, 100.0, AT_ONCE).freeze] == ["t2", "t1"]


def test_a_neighbour_across_gpus_counts_as_relieved_only_as_far_as_its_least_relieved_gpu():
    # old on GPUs 0 and 1 at 3x; t3, t4 on GPU 0, t1, t2 on GPU 1: freezing t4 and t3 (the
    # newest) relieves GPU 0 only, and GPU 1 bounds old: t2 goes as well, which puts old at
    # 1 + 2 x 1/2 = 2x on GPU 1, within the limit: t1 runs on
    jobs, watched, _ = _pile(3.0)
    views = [Neighbour("old", (0, 1), 0, True, 3.0, True), Neighbour("t1", (1,), 1, True, 1.0),
             Neighbour("t2", (1,), 2, True, 1.0), Neighbour("t3", (0,), 3, True, 1.0), Neighbour("t4", (0,), 4, True, 1.0)]
    assert [f.job_id for f in review(jobs, watched, lambda j: views, 100.0, AT_ONCE).freeze] == ["t4", "t3", "t2"]


def test_jobs_frozen_together_thaw_together_when_room_returns():
    beside = ("old", "t1")
    frozen = {f"t{i}": Job(f"t{i}", state=JobState.RUNNING, started_at=10.0 * i, on_trial=True, suspended="trial",
                           suspended_at=100.0, suspended_beside=beside) for i in (2, 3, 4)}
    jobs, watched, around = _pile(1.6, **frozen)
    # old and t1 run on: they stay frozen, none of them counts the others as gone
    assert not review(jobs, watched, around, 200.0, AT_ONCE)
    # t1 ended: all three thaw
    views = [n for n in around("old") if n.job_id != "t1"]
    del jobs["t1"]
    assert sorted(review(jobs, ["t2", "t3", "t4"], lambda j: views, 200.0, AT_ONCE).thaw) == ["t2", "t3", "t4"]


def test_the_scheduler_stops_a_frozen_jobs_clock_and_a_user_suspension_is_the_users():
    cluster = ClusterSnapshot.from_views([GpuView(GPU, 80_000.0)], now=0.0)

    def place(queue, snapshot):
        return Plan((Placement(queue[0].id, (GPU,), trial=True),))

    s = Scheduler(place, Capacity.of(cluster))  # type: ignore[arg-type]
    s.submit(Job("j", mem_mib=1000.0, time_limit_s=100.0))
    s.schedule(cluster)
    assert s.jobs["j"].on_trial and s.reviewing
    s.suspend("j", "trial", 40.0, why="slowed job x")
    assert not s.overdue(500.0)  # frozen: its limit does not run
    s.resume("j", 70.0)
    assert s.jobs["j"].frozen_s == 30.0 and s.jobs["j"].thawed_at == 70.0
    assert not s.overdue(129.0) and [j.id for j in s.overdue(130.0)]  # 100 s of running, 30 frozen
    s.suspend("j", "user", 80.0)
    # the scheduler never thaws what a user suspended
    assert not s.review(lambda job_id: [], 1000.0).thaw and s.jobs["j"].suspended == "user"
    assert s.jobs["j"].state is JobState.RUNNING
    # an end clears the suspension
    s.cancel("j", now=90.0)
    assert not s.jobs["j"].suspended and not s.reviewing


def test_the_simulator_freezes_a_job_that_turned_out_heavy_and_every_job_ends_done():
    # `a` (SM 0.5) trains alone; `b`, unknown to the daemon, starts beside it on its prior and
    # turns out heavy (SM 1.0): once the readings price it, the model says `a` runs 2.8x slower
    # under time-slicing, past the limit: `b` is frozen (no progress, memory kept) until `a` ends
    base = Workload("base", 1, 300.0, 8000.0, {"declared": 8192.0}, JobProfile(0.5, 0.3), command="a", program="a")
    heavy = Workload("heavy", 1, 100.0, 8000.0, {"declared": 8192.0}, JobProfile(1.0, 0.9), command="b",
                     program="b")
    trace = [TraceJob("a", 0.0, base), TraceJob("b", 30.0, heavy)]
    sim = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto"),
                     SimConfig(estimator="declared", profiles="unknown", ramp_s=2.0, startup_s=5.0))
    seen = []
    review_once = sim._review

    def watch(now):
        changed = review_once(now)
        run = sim.running.get("b")
        if run is not None and run.frozen:
            seen.append((now, run.work_left, sim.used[0], sim.scheduler.jobs["b"].suspended))
        return changed

    sim._review = watch  # type: ignore[method-assign]
    result = sim.run()
    records = {r.id: r for r in result.records}
    assert all(r.state == "done" for r in records.values())
    assert result.frozen_seconds > 200.0
    assert records["a"].end < 300.0 * 1.1  # a ran (almost) as if alone once b was frozen
    assert records["b"].end >= records["a"].end  # b waited frozen for a's end, then finished
    assert len({round(w, 6) for _, w, _, _ in seen}) == 1  # frozen: no progress
    assert all(used >= 2 * 8000.0 for _, _, used, _ in seen)  # ... and its memory kept
    assert all(by == "trial" for *_, by in seen)
    # its record says when: frozen as first seen frozen, thawed as `a` ended (parity compares them)
    (since, until), = records["b"].frozen
    assert since == seen[0][0] and until == pytest.approx(records["a"].end)
    assert until - since == pytest.approx(result.frozen_seconds)


@pytest.mark.parametrize("at_once", [True, False])
def test_the_simulator_takes_a_pile_up_back_in_one_review(at_once):
    # four jobs nobody has measured start at once beside `a` on a GPU that reads room
    # (observe_slots=99); once the readings price them they slow each other past the limit:
    # the first take-back freezes all but one of them (one, under the rule before)
    base = Workload("base", 1, 300.0, 8000.0, {"declared": 8192.0}, JobProfile(0.5, 0.3), command="a", program="a")
    trace = [TraceJob("a", 0.0, base)] + [
        TraceJob(f"h{i}", 30.0, Workload(f"h{i}", 1, 100.0, 8000.0, {"declared": 8192.0}, JobProfile(0.6, 0.4),
                                         command=f"h{i}", program=f"h{i}")) for i in range(4)]
    sim = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto", observe_slots=99),
                     SimConfig(estimator="declared", profiles="unknown", ramp_s=2.0, startup_s=5.0))
    sim.scheduler.suspend_rules = SuspendRules(at_once=at_once)
    frozen: list[int] = []
    review_once = sim.scheduler.review

    def watch(neighbourhood, now):
        decided = review_once(neighbourhood, now)
        if decided.freeze:
            frozen.append(len(decided.freeze))
        return decided

    sim.scheduler.review = watch  # type: ignore[method-assign]
    result = sim.run()
    assert all(r.state == "done" for r in result.records)
    assert frozen[0] == (3 if at_once else 1)


@pytest.mark.parametrize("frozen_room", [True, False])
def test_the_simulator_keeps_a_frozen_pile_ups_room_from_newcomers_nobody_has_priced(frozen_room):
    # a light job `a` and four unpriced ones that pile up beside it (observe_slots=99); three are
    # taken back at once, and the GPU reads room again (SM 0.15 + 0.4). Newcomers arriving then
    # take that room unless the frozen jobs hold it (``Auto.frozen_room``); they wait for the
    # thaw. The world's count of frozen jobs is the scheduler's record at every launch.
    base = Workload("base", 1, 300.0, 8000.0, {"declared": 8192.0}, JobProfile(0.15, 0.1), command="a", program="a")
    trace = [TraceJob("a", 0.0, base)] + [
        TraceJob(f"h{i}", 30.0, Workload(f"h{i}", 1, 100.0, 8000.0, {"declared": 8192.0}, JobProfile(0.4, 0.3),
                                         command=f"h{i}", program=f"h{i}")) for i in range(4)] + [
        TraceJob(f"n{i}", 70.0 + 10 * i, Workload(f"n{i}", 1, 50.0, 4000.0, {"declared": 4096.0},
                                                  JobProfile(0.3, 0.2), command=f"n{i}", program=f"n{i}"))
        for i in range(3)]
    sim = Simulation(parse_cluster("1xH100-80GB"), trace,
                     make_policy("auto", observe_slots=99, frozen_room=frozen_room),
                     SimConfig(estimator="declared", profiles="unknown", ramp_s=2.0, startup_s=5.0))
    sim.scheduler.suspend_rules = AT_ONCE
    beside_frozen: list[str] = []
    launch = sim._launch

    def watch(job_id, gpus, now, room):
        held = sum(1 for j in sim.running if sim.scheduler.jobs[j].suspended in ("trial", "preempt"))
        assert int(sim.world.n_frozen(gpus[0])) >= held  # ... and the thawed few samples ago
        if held:
            beside_frozen.append(job_id)
        return launch(job_id, gpus, now, room)

    sim._launch = watch  # type: ignore[method-assign]
    result = sim.run()
    assert all(r.state == "done" for r in result.records)
    assert result.frozen_seconds > 0.0
    starts = {r.id: r.start for r in result.records}
    if frozen_room:
        assert beside_frozen == [] and min(starts[f"n{i}"] for i in range(3)) > 100.0
    else:
        assert beside_frozen == ["n0", "n1", "n2"] and starts["n0"] == pytest.approx(70.0)


def test_simulate_take_back_at_once_relieves_the_slowed_neighbour_sooner(tmp_path):
    # the pile-up above from the command line: four unpriced jobs start beside `a` at once
    # (observe_slots=99); taken back in one step, `a` runs alone again sooner and ends earlier
    from typer.testing import CliRunner

    from collocate.cli import app

    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival_s,gpus,duration_s,peak_mib,sm_activity,dram_activity\na,0,1,300,8000,0.5,0.3\n"
                     + "".join(f"h{i},30,1,100,8000,0.6,0.4\n" for i in range(4)))
    ends = {}
    for flag in ("", "--freeze-at-once"):
        args = ["simulate", "--trace", str(trace), "--cluster", "1xH100-80GB", "--policy", "auto",
                "--profiles", "unknown", "--param", "observe_slots=99", "--startup-s", "5", "--format", "json",
                "--out", str(tmp_path / (flag or "one-by-one")), *([flag] if flag else [])]
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, out.output
        rows = [line.split(",") for line in (tmp_path / (flag or "one-by-one") / "jobs.csv").read_text().splitlines()]
        assert all(r[7] == "done" for r in rows[1:])
        ends[flag] = {r[1]: float(r[6]) for r in rows[1:]}
    assert ends["--freeze-at-once"]["a"] < ends[""]["a"] - 30.0
