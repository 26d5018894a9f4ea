"""The simulator end to end: the golden sanity figure, determinism, OOM, and the CLI."""

import json
import subprocess
import sys

import pytest

from collocate.common.errors import InputError
from collocate.core.commitment import QUIET_S
from collocate.core.gputypes import parse_cluster
from collocate.core.policies import POLICY_NAMES, make_policy
from collocate.core.world import MIN_SEGMENT_SAMPLES
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.synth import synthetic_trace
from collocate.sim.trace import load_catalogue, load_trace


@pytest.fixture(scope="module")
def heavy60(shared_data):
    return load_trace(shared_data / "carma-heavy-60.csv", load_catalogue(shared_data / "carma-workloads.csv"))


def run(trace, policy, cluster="4xA100-40GB", **config):
    return Simulation(parse_cluster(cluster), trace, make_policy(policy), SimConfig(**config)).run()


def test_exclusive_fifo_on_heavy60_matches_the_independent_replay(heavy60):
    # ../shared/data/README.md: strict FIFO on whole GPUs, no overheads: about 594 minutes.
    assert summarize(run(heavy60, "exclusive")).makespan_min == pytest.approx(594, abs=1)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_job_ends_exactly_once(heavy60, policy):
    result = run(heavy60, policy)
    assert sorted(r.id for r in result.records) == sorted(j.id for j in heavy60)
    assert all(r.state in ("done", "failed", "rejected") and r.end is not None for r in result.records)


def test_same_seed_same_result():
    trace = synthetic_trace(300, gpus=8, seed=7)
    a = summarize(run(trace, "auto", "8xA100-40GB"))
    b = summarize(run(synthetic_trace(300, gpus=8, seed=7), "auto", "8xA100-40GB"))
    assert a == b
    c = summarize(run(synthetic_trace(300, gpus=8, seed=8), "auto", "8xA100-40GB"))
    assert c != a


def test_underestimates_crash_and_recover_while_the_peak_oracle_never_crashes(heavy60):
    oracle = summarize(run(heavy60, "carma-magm", estimator="peak"))
    assert oracle.oom_crashes == 0
    blind = summarize(run(heavy60, "round-robin"))
    assert blind.oom_crashes > 0 and blind.recovered_jobs > 0


def test_collocation_beats_exclusive_and_auto_keeps_oom_at_the_best_memory_aware_level(shared_data):
    catalogue = load_catalogue(shared_data / "carma-workloads.csv")
    trace = load_trace(shared_data / "carma-mix-90.csv", catalogue)
    s = {p: summarize(run(trace, p)) for p in ("exclusive", "carma-magm", "auto")}
    assert s["auto"].mean_jct_min < s["carma-magm"].mean_jct_min < s["exclusive"].mean_jct_min
    assert s["auto"].makespan_min < s["exclusive"].makespan_min
    # H100-calibrated time-slicing: heavy jobs sharing a GPU run slower than one after the other,
    # which auto's interference model avoids and CARMA's utilization threshold does not
    # (582.8 against 631.8 min with the sourced profiles, docs/simulator.md)
    assert s["auto"].makespan_min < 0.95 * s["carma-magm"].makespan_min
    assert s["auto"].energy_kwh <= 1.02 * s["carma-magm"].energy_kwh
    assert s["auto"].oom_crashes <= s["carma-magm"].oom_crashes


def test_mps_interferes_less_than_time_slicing():
    trace = synthetic_trace(200, gpus=4, seed=3)
    ts = summarize(run(trace, "shares", "4xA100-40GB", sharing="time-slicing"))
    mps = summarize(run(trace, "shares", "4xA100-40GB", sharing="mps"))
    assert mps.mean_jct_min < ts.mean_jct_min


def test_cli_prints_one_json_document_and_writes_plots(shared_data, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "collocate.cli", "simulate",
         "--trace", str(shared_data / "carma-heavy-60.csv"),
         "--workloads", str(shared_data / "carma-workloads.csv"),
         "--policy", "exclusive,auto", "--format", "json", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [p["policy"] for p in doc["policies"]] == ["exclusive", "auto"]
    assert {"makespan_min", "mean_jct_min", "energy_kwh", "oom_crashes"} <= set(doc["policies"][0])
    assert (tmp_path / "jobs.csv").read_text().count("\n") == 121
    assert (tmp_path / "jct_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_bad_names_exit_2_and_list_valid_choices(shared_data):
    for args, expected in (
        (["--policy", "fastest"], "carma-magm"),
        (["--cluster", "4xV100"], "A100-40GB"),
        (["--estimator", "guess"], "faketensor"),
        (["--policy", "exclusive,auto", "--param", "bogus=1"], "min_gain"),  # auto's parameters
        (["--profiles", "guess"], "trace, unknown"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "collocate.cli", "simulate", "--synthetic", "5", *args],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 2 and expected in out.stderr, out.stderr


def test_a_shared_gpu_reads_and_draws_its_realized_activity_not_the_sum_of_solo_activities():
    # On an H100, 7 time-sliced copies of a job of SM activity 0.3 read 0.49, not 1: each copy
    # does its work 1/slowdown as fast, so the GPU's counters see sum(a * rate).
    from collocate.core.interference import default_interference
    from collocate.core.model import JobProfile, SharingMode
    from collocate.sim.trace import TraceJob, Workload

    profile = JobProfile(0.3, 0.2)
    work = Workload("light", 1, 600.0, 1000.0, profile=profile)
    trace = [TraceJob(f"j{k}", 0.0, work) for k in range(4)]
    result = run(trace, "round-robin", "1xH100-80GB", ramp_s=0.0)
    slowdown = default_interference().slowdown(SharingMode.TIME_SLICING, profile, [profile] * 3)
    assert slowdown > 1.2  # the four copies over-subscribe the GPU: 4 x 0.3 > 1 with overheads
    timeline = next(iter(result.timelines.values()))
    assert max(busy for _, _, busy in timeline) == pytest.approx(4 * 0.3 / slowdown)
    assert 4 * 0.3 / slowdown < 1.0
    # the metered busy time (and energy) integrates the same readings
    steps = zip(timeline, [*timeline[1:], (result.makespan_s, 0.0, 0.0)], strict=False)
    integral = sum((t1 - t0) * busy for (t0, _, busy), (t1, _, _) in steps)
    assert result.sm_util == pytest.approx(integral / result.makespan_s)


def test_cli_param_reaches_the_policies_that_have_it(tmp_path):
    # Short jobs: a 30 s in-flight guard serialises them, a 5 s one lets CARMA collocate.
    trace = tmp_path / "short.csv"
    trace.write_text("id,arrival_s,gpus,duration_s,peak_mib,sm_activity,dram_activity\n"
                     + "".join(f"j{k},{k},1,20,2000,0.2,0.1\n" for k in range(6)))

    def makespans(*extra):
        out = subprocess.run(
            [sys.executable, "-m", "collocate.cli", "simulate", "--trace", str(trace), "--cluster",
             "1xH100-80GB", "--policy", "exclusive,carma-magm", "--format", "json", *extra],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return [p["makespan_min"] for p in json.loads(out.stdout)["policies"]]

    (excl, carma), (excl5, carma5) = makespans(), makespans("--param", "settle_s=5")
    assert excl5 == excl  # exclusive has no settle_s: untouched
    assert carma5 < carma


def test_a_starting_job_neither_slows_nor_is_slowed_and_reads_idle():
    # On an H100 a job's first ~10 s (import, CUDA context) use no SM: two time-sliced jobs whose
    # start-ups overlap each other's work cost each other nothing then (mini-trace, 2026-11-23).
    from collocate.core.interference import default_interference
    from collocate.core.model import JobProfile, SharingMode
    from collocate.sim.trace import TraceJob, Workload

    profile = JobProfile(0.8, 0.5)
    heavy = Workload("heavy", 1, 30.0, 1000.0, profile=profile)
    trace = [TraceJob("a", 0.0, heavy), TraceJob("b", 0.0, heavy)]
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("round-robin", settle_s=1),
                        SimConfig(ramp_s=0.0, startup_s=10.0)).run()
    end = {r.id: r.end for r in result.records}
    slowdown = default_interference().slowdown(SharingMode.TIME_SLICING, profile, [profile])
    assert slowdown > 1.5
    # a: 10 s start-up + 1 s alone; b placed at 11 s (a seen at 10 + 1 s guard) and starting
    # until 21 s, so a works alone until 21 s (21 s done, 9 left); then both share.
    assert end["a"] == pytest.approx(21 + 9 * slowdown)
    # b: 10 s of start-up done by 21 s, 20 s left: shared until a ends, then alone
    assert end["b"] == pytest.approx(end["a"] + 20 - 9)
    timeline = next(iter(result.timelines.values()))
    assert all(busy == 0.0 for t, _, busy in timeline if t < 10.0)
    assert max(busy for _, _, busy in timeline) == pytest.approx(0.8)  # either one alone
    # a job that ends inside its start-up simply takes its duration
    short = Workload("short", 1, 5.0, 1000.0, profile=profile)
    quick = run([TraceJob("s", 0.0, short)], "exclusive", "1xH100-80GB", startup_s=10.0)
    assert quick.records[0].end == pytest.approx(5.0)


@pytest.mark.parametrize("estimator, b_starts_at", [("gpumemnet", 10.0 + QUIET_S), ("declared", 600.0),
                                                    ("horus", 600.0)])
def test_a_job_shares_beside_an_overestimated_one_once_its_memory_holds_still(estimator, b_starts_at):
    # a holds 2,000 MiB of a 40 GiB GPU; its estimate says 30,000, b's 20,000 (the declared
    # requirement, a reservation, stays). Memory ramps to its peak by 10 s; QUIET_S later an
    # estimate gives way.
    # Horus has no figure for these jobs: each falls back to its declaration, kept whole.
    from collocate.core.model import JobProfile
    from collocate.sim.trace import TraceJob, Workload

    light = JobProfile(0.1, 0.05)
    a = Workload("a", 1, 600.0, 2000.0, {"gpumemnet": 30000.0, "declared": 30000.0}, profile=light)
    b = Workload("b", 1, 60.0, 15000.0, {"gpumemnet": 20000.0, "declared": 20000.0}, profile=light)
    result = run([TraceJob("a", 0.0, a), TraceJob("b", 10.0, b)], "auto", "1xA100-40GB",
                 estimator=estimator, ramp_s=10.0, startup_s=0.0)
    start = {r.id: r.start for r in result.records}
    assert start["b"] == pytest.approx(b_starts_at)
    assert all(r.oom_crashes == 0 for r in result.records)


def test_a_warming_job_is_seen_but_idle_and_unslowed():
    # A job's first steps (cuDNN autotuning, lazy kernel loading) took 2-9 s on an H100 at almost
    # no SM activity (mini-trace, 2026-11-23): its warm-up neither slows nor is slowed, and the
    # in-flight guard runs from start-up's end, not warm-up's.
    from collocate.core.interference import default_interference
    from collocate.core.model import JobProfile, SharingMode
    from collocate.sim.trace import TraceJob, Workload

    profile = JobProfile(0.8, 0.5)
    warming = Workload("warming", 1, 30.0, 1000.0, profile=profile, warmup_s=10.0)
    plain = Workload("plain", 1, 30.0, 1000.0, profile=profile)
    trace = [TraceJob("a", 0.0, warming), TraceJob("b", 0.0, plain)]
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("round-robin", settle_s=1),
                        SimConfig(ramp_s=0.0)).run()
    start = {r.id: r.start for r in result.records}
    end = {r.id: r.end for r in result.records}
    slowdown = default_interference().slowdown(SharingMode.TIME_SLICING, profile, [profile])
    b_start = start["b"]
    assert start["a"] == 0.0 and 0.0 < b_start < 10.0  # placed while a still warms up
    # b works alone until a's warm-up ends at 10 s; then both share: a has 20 s of work left,
    # b has 20 + b_start, so b outlives a by b_start and finishes it alone.
    assert end["a"] == pytest.approx(10 + 20 * slowdown)
    assert end["b"] == pytest.approx(end["a"] + b_start)
    timeline = next(iter(result.timelines.values()))
    assert all(busy == 0.0 for t, _, busy in timeline if t < b_start)


def test_a_warming_job_draws_warm_up_power_after_start_up():
    # On the H100 a process in its first steps drew 132 W median at SM activity under 0.05,
    # against 76 W with no process: start-up (import, not yet on the GPU) is charged idle power,
    # warm-up the model's warmup_busy, then the job's own activity.
    from collocate.core.gputypes import GPU_TYPES
    from collocate.core.interference import default_interference
    from collocate.core.model import JobProfile
    from collocate.sim.trace import TraceJob, Workload

    model = default_interference()
    assert 0 < model.warmup_busy < 0.5
    h100 = GPU_TYPES["H100-80GB"]
    profile = JobProfile(0.6, 0.3)
    job = Workload("warming", 1, 30.0, 1000.0, profile=profile, warmup_s=10.0)

    def energy(cfg: SimConfig) -> float:
        result = Simulation(parse_cluster("1xH100-80GB"), [TraceJob("a", 0.0, job)],
                            make_policy("exclusive"), cfg).run()
        assert result.makespan_s == pytest.approx(30.0)
        return result.energy_j

    def watts(busy: float) -> float:
        return model.power_watts(h100.idle_watts, h100.max_watts, [JobProfile(busy, 0.0)])

    expected = 5 * watts(0.0) + 10 * watts(model.warmup_busy) + 15 * watts(0.6)
    assert energy(SimConfig(ramp_s=0.0, startup_s=5.0)) == pytest.approx(expected)
    # without a start-up phase the warm-up draws from the first second
    expected = 10 * watts(model.warmup_busy) + 20 * watts(0.6)
    assert energy(SimConfig(ramp_s=0.0)) == pytest.approx(expected)


def test_policies_told_nothing_of_profiles_still_run_jobs_at_their_real_activity():
    # The daemon knows a job's activity only from history; the H100 mini-trace's jobs had none,
    # so `auto` priced each as UNKNOWN_PROFILE (0.5/0.2). The simulator can replay that blindness.
    from collocate.core.interference import default_interference
    from collocate.core.model import JobProfile, SharingMode
    from collocate.sim.trace import TraceJob, Workload

    heavy = JobProfile(0.79, 0.6)  # under the risk filter's SM limit (0.8): only pricing decides
    model = default_interference()
    assert 2.0 / model.slowdown(SharingMode.TIME_SLICING, heavy, [heavy]) < 1.0  # pairing loses progress
    w = Workload("heavy", 1, 30.0, 1000.0, {"peak": 1000.0}, heavy)  # memory known: may share
    trace = [TraceJob("a", 0.0, w), TraceJob("b", 0.0, w)]

    def ends(known: bool) -> tuple[dict, dict]:
        config = SimConfig(ramp_s=0.0, profiles="trace" if known else "blind")
        result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto"),
                            config).run()
        return {r.id: r.start for r in result.records}, {r.id: r.end for r in result.records}

    start, end = ends(True)  # told the truth, auto will not pair two heavy jobs
    assert start["b"] == pytest.approx(30.0) and end["b"] == pytest.approx(60.0)
    start, end = ends(False)  # told nothing, it pairs them, and they slow by their real profiles
    slowdown = model.slowdown(SharingMode.TIME_SLICING, heavy, [heavy])
    b = start["b"]
    assert b == 0.0  # its memory is known, so it is committed at once: no settle wait
    assert end["a"] == pytest.approx(b + (30.0 - b) * slowdown)
    assert end["b"] == pytest.approx(end["a"] + b)



@pytest.mark.parametrize(("b_arrives", "paired"), [(1.0, True), ((MIN_SEGMENT_SAMPLES + 1) * 1.0 + 1.0, False)])
def test_a_jobs_activity_is_read_on_its_gpu_within_seconds(b_arrives, paired):
    # Two heavy jobs (a pair would make less progress than one alone). Policies are told nothing;
    # a's GPU reads its activity from its first steps, and MIN_SEGMENT_S of readings price it:
    # b arriving before that is paired with a, as a blind daemon would; b arriving after it
    # waits for a, as an informed one does.
    from collocate.core.model import JobProfile
    from collocate.sim.trace import TraceJob, Workload

    w = Workload("heavy", 1, 30.0, 1000.0, {"peak": 1000.0}, JobProfile(0.79, 0.6))
    trace = [TraceJob("a", 0.0, w), TraceJob("b", b_arrives, w)]
    config = SimConfig(ramp_s=0.0, profiles="learned")
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto"),
                        config).run()
    start = {r.id: r.start for r in result.records}
    assert (start["b"] == pytest.approx(b_arrives)) is paired
    if not paired:
        assert start["b"] == pytest.approx(30.0)


def test_unknown_profile_knowledge_is_refused():
    with pytest.raises(InputError, match="profile knowledge"):
        SimConfig(profiles="guessed")


@pytest.mark.parametrize(("command", "c_waits"), [("train-heavy", True), (None, False)])
def test_learned_profiles_are_remembered_for_jobs_of_the_same_command(command, c_waits):
    # a runs alone and is learned; b and c come after a's end. With the same command, both are
    # known from a's run (the daemon's history), so c waits for b; without one, c is paired.
    from collocate.core.model import JobProfile
    from collocate.sim.trace import TraceJob, Workload

    w = Workload("heavy", 1, 30.0, 1000.0, {"peak": 1000.0}, JobProfile(0.79, 0.6), command=command)
    trace = [TraceJob("a", 0.0, w), TraceJob("b", 31.0, w), TraceJob("c", 32.0, w)]
    config = SimConfig(ramp_s=0.0, profiles="learned")
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto"),
                        config).run()
    start = {r.id: r.start for r in result.records}
    assert start["b"] == pytest.approx(31.0)
    assert start["c"] == pytest.approx(61.0 if c_waits else 32.0)


@pytest.mark.parametrize(("profiles", "program", "c_waits"),
                         [("unknown", "train.py", True), ("learned", "train.py", False),
                          ("unknown", None, False)])
def test_similar_profiles_come_from_other_commands_of_the_program(profiles, program, c_waits):
    # a is learned; b and c are other commands (a sweep's other points) arriving after a's end.
    # With "unknown" (family priors) and a shared family they start with a's profile shrunk half-way toward the
    # prior, heavy enough that c waits for b; with "learned" (or no family) they are unknown and
    # c is paired with b. (Start-up slots off: they would let the unpriced c start beside b.)
    from collocate.core.model import JobProfile
    from collocate.sim.trace import TraceJob, Workload

    def point(name: str) -> Workload:
        return Workload(name, 1, 30.0, 1000.0, {"peak": 1000.0}, JobProfile(0.79, 0.6),
                        command=name, program=program)

    trace = [TraceJob("a", 0.0, point("lr-1")), TraceJob("b", 31.0, point("lr-2")),
             TraceJob("c", 32.0, point("lr-3"))]
    config = SimConfig(ramp_s=0.0, profiles=profiles)
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto", startup_slots=0),
                        config).run()
    start = {r.id: r.start for r in result.records}
    assert start["c"] == pytest.approx(61.0 if c_waits else 32.0)


def test_catalogue_rows_of_one_model_and_dataset_share_a_program(tmp_path):
    from collocate.sim.trace import load_catalogue

    path = tmp_path / "cat.csv"
    path.write_text("name,model,dataset,batch_size,gpus,epoch_minutes,epochs,peak_mib\n"
                    "r1,resnet50,imagenet,32,1,1,1,3000\nr2,resnet50,imagenet,64,1,1,1,5000\n"
                    "r3,resnet50,cifar-100,64,1,1,1,2000\nx,,,8,1,1,1,100\n")
    cat = load_catalogue(path)
    assert cat["r1"].program == cat["r2"].program != cat["r3"].program
    assert cat["x"].program is None


def test_a_job_using_no_gpu_past_the_longest_start_up_stops_holding_its_gpus_start_up_slot():
    # a runs a CPU prelude of 300 s before it touches its GPU; x trains beside it. b, unpriced,
    # is turned away by the gain gate at its prior and may start past it on trial only where
    # no job is still starting: a counts as starting for STARTUP_MAX_S only, so b starts then.
    from collocate.core.model import JobProfile
    from collocate.core.world import STARTUP_MAX_S
    from collocate.sim.trace import TraceJob, Workload

    def job(name: str, seconds: float, startup_s: float) -> Workload:
        return Workload(name, 1, seconds, 8000.0, {"declared": 8000.0}, JobProfile(0.3, 0.15),
                        startup_s=startup_s, command=name)

    trace = [TraceJob("a", 0.0, job("a", 400.0, 300.0)), TraceJob("x", 0.0, job("x", 400.0, 0.0)),
             TraceJob("b", 1.0, job("b", 30.0, 0.0))]
    config = SimConfig(estimator="declared", profiles="unknown", ramp_s=2.0)
    result = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto"), config).run()
    start = {r.id: r.start for r in result.records}
    assert start["a"] == start["x"] == 0.0
    assert start["b"] == pytest.approx(STARTUP_MAX_S)  # not 300 s, when a first holds memory


def test_a_job_crashes_at_the_ramp_step_past_its_fence_and_its_next_attempt_runs_whole():
    """Declared 1,000 MiB, it ramps to 6,000 in four steps: the second (3,000 MiB) passes its
    fence, so it crashes there, and its requirement is raised from what it held and tried to
    allocate, as PyTorch's message tells the daemon (3,000 x 1.25 + 512). Its next attempt runs
    its whole duration: the crashed attempt's finish, still queued, does not end it."""
    from collocate.core.model import JobProfile, SharingMode
    from collocate.sim.trace import TraceJob, Workload

    def job(i: str, sm: float, peak: float, declared: float) -> TraceJob:
        return TraceJob(i, 0.0, Workload(f"j{i}", 1, 10.0, peak, {"declared": declared}, JobProfile(sm, sm / 2)))

    config = SimConfig(sharing=SharingMode.TIME_SLICING, estimator="declared", ramp_s=2.0)
    sim = Simulation(parse_cluster("1xA100-40GB"), [job("1", 0.1, 4000.0, 4000.0), job("2", 0.3, 6000.0, 1000.0)],
                     make_policy("auto"), config)
    crashed = sim.run().records[1]
    (_, start, end, outcome), (_, again, done, last) = crashed.spans
    assert (outcome, last) == ("oom", "done") and end - start == pytest.approx(1.0)  # 2 of 4 steps of 2 s
    assert sim.scheduler.jobs["2"].mem_mib == pytest.approx(3000.0 * 1.25 + 512.0)
    assert done - again >= 10.0
