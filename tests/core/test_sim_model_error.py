"""``--model-error``: simulated mixes run at the model's slowdown times a held-out calibration
error, fixed per job and co-runners, seeded, and never faster than alone."""

import json
import math
import subprocess
import sys

import pytest

from collocate.common.errors import InputError
from collocate.core.gputypes import parse_cluster
from collocate.core.interference import default_interference, load_interference
from collocate.core.model import JobProfile, SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.model_error import ModelError
from collocate.sim.trace import TraceJob, Workload, load_catalogue, load_trace


@pytest.fixture(scope="module")
def heavy60(shared_data):
    return load_trace(shared_data / "carma-heavy-60.csv", load_catalogue(shared_data / "carma-workloads.csv"))


def run(trace, policy, **config):
    return Simulation(parse_cluster("4xA100-40GB"), trace, make_policy(policy), SimConfig(**config)).run()


def test_a_draw_is_one_of_the_held_out_errors_and_fixed_for_a_job_and_its_co_runners():
    error = ModelError.of(default_interference(), SharingMode.TIME_SLICING, seed=5)
    held_out = {round(math.exp(v), 12) for v in default_interference().held_out_log_errors[SharingMode.TIME_SLICING]}
    draws = {round(error.factor(str(j), ["a", "b"]), 12) for j in range(200)}
    assert draws <= held_out and len(draws) > 10  # spread over the pool, nothing invented
    assert error.factor("7", ["a", "b"]) == error.factor("7", ["b", "a"])  # a set of co-runners
    others = [error.factor("7", [c]) for c in "cdefghijkl"]
    assert len(set(others)) > 1  # a new mix draws afresh
    reseeded = [ModelError.of(default_interference(), SharingMode.TIME_SLICING, seed=s).factor("7", ["a", "b"])
                for s in range(6, 12)]
    assert any(f != error.factor("7", ["a", "b"]) for f in reseeded)  # the seed decides the draw

def test_a_pair_runs_at_the_models_slowdown_times_its_drawn_error():
    model, mode = default_interference(), SharingMode.MPS
    a, b = JobProfile(0.3, 0.15), JobProfile(0.4, 0.2)
    jobs = [TraceJob("1", 0.0, Workload("one", 1, 1000.0, 2000.0, {"peak": 2000.0}, a)),
            TraceJob("2", 0.0, Workload("two", 1, 3000.0, 2000.0, {"peak": 2000.0}, b))]
    nodes = parse_cluster("1xA100-40GB")
    # a seed whose draw for job 1 beside job 2 moves its slowdown well away from the model's
    seed = next(s for s in range(100) if ModelError.of(model, mode, s).factor("1", ["2"]) > 1.05)
    slowdown = model.slowdown(mode, a, [b]) * ModelError.of(model, mode, seed).factor("1", ["2"])

    def first_end(**config):
        result = Simulation(nodes, jobs, make_policy("round-robin"), SimConfig(sharing=mode, **config)).run()
        one, two = sorted(result.records, key=lambda r: r.id)
        assert one.start == 0.0 and 0.0 < two.start < one.end  # alone until job 2 joins, then shared
        return one.end, two.start

    end, joined = first_end(model_error_seed=seed)
    assert end == pytest.approx(joined + (1000.0 - joined) * slowdown)
    end, joined = first_end()
    assert end == pytest.approx(joined + (1000.0 - joined) * model.slowdown(mode, a, [b]))


def test_exclusive_is_untouched_and_collocation_moves_with_the_seed(heavy60):
    assert summarize(run(heavy60, "exclusive", model_error_seed=1)) == summarize(run(heavy60, "exclusive"))
    plain = summarize(run(heavy60, "auto")).makespan_min
    seeded = [summarize(run(heavy60, "auto", model_error_seed=s)).makespan_min for s in (1, 2)]
    assert seeded[0] != plain and seeded[0] != seeded[1]
    assert summarize(run(heavy60, "auto", model_error_seed=1)).makespan_min == seeded[0]


def test_no_job_runs_faster_than_alone_under_model_error(heavy60):
    duration = {j.id: j.workload.duration_s for j in heavy60}
    for sharing, layout in [(m, layout) for m in SharingMode for layout in (None, "default")]:
        policy = "carma-magm" if layout is None else "shares"  # shares puts jobs on one instance
        result = run(heavy60, policy, sharing=sharing, mig_layout=layout, model_error_seed=4)
        assert summarize(result) != summarize(run(heavy60, policy, sharing=sharing, mig_layout=layout))
        assert all(r.end - r.start >= duration[r.id] - 1e-6 for r in result.records if r.state == "done")


def test_a_model_without_held_out_errors_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "interference.toml"
    path.write_text('[modes.time-slicing]\nbase = 0.1\n[modes.mps]\nbase = 0.1\n[modes.mig]\nbase = 0.05\n')
    with pytest.raises(InputError, match="held-out errors") as info:
        ModelError.of(load_interference(path), SharingMode.TIME_SLICING, seed=1)
    assert "--model-error" in (info.value.hint or "")


def test_simulate_cli_reports_the_seed(shared_data):
    out = subprocess.run(
        [sys.executable, "-m", "collocate.cli", "simulate", "--trace", str(shared_data / "carma-heavy-60.csv"),
         "--workloads", str(shared_data / "carma-workloads.csv"), "--policy", "auto", "--model-error", "2",
         "--format", "json"], capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(out.stdout)
    assert doc["model_error_seed"] == 2
    assert doc["policies"][0]["makespan_min"] == pytest.approx(
        summarize(run(load_trace(shared_data / "carma-heavy-60.csv", load_catalogue(shared_data / "carma-workloads.csv")),
                      "auto", model_error_seed=2)).makespan_min, abs=0.01)
