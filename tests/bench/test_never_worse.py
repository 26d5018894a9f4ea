"""benchmarks/never_worse.py: each goal's scenario is drawn as issue 35 words it, from the seed,
and the quick run of goals a and e goes end to end (real daemons on emulated GPUs, real jobs)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from never_worse import BUSY_SM, GIB, run_probe_scenario, run_queue_scenario, scenarios, verdict  # noqa: E402


@pytest.mark.parametrize("quick", [False, True])
def test_each_scenario_is_the_issues_goal_drawn_from_the_seed(quick):
    drawn = {s.goal: s for s in scenarios(7, quick)}
    assert scenarios(7, quick) == list(drawn.values()) and scenarios(8, quick) != list(drawn.values())
    for j in drawn["a"].jobs:  # declared 2-4 GiB, needs up to 10x, at most 30 GiB
        assert 2 * GIB <= j.declared_mib <= 4 * GIB < j.need_mib <= min(30 * GIB, 10 * j.declared_mib + 1)
    assert {r.name for r in drawn["a"].runs} == {"exclusive", "auto", "auto --retries 0"}
    assert next(r for r in drawn["a"].runs if r.name == "auto --retries 0").submit == {"retries": 0}
    for j in drawn["b"].jobs:  # declares what it starts with, grows at 50-80 % of progress
        assert j.declared_mib == j.mem_mib < j.peak_mib <= 30 * GIB and 0.5 <= j.peak_at <= 0.8
    assert all(j.declared_mib is None for j in drawn["c"].jobs)
    mixed = drawn["d"].jobs
    assert len(mixed) >= (18 if quick else 50) and 0 < sum(j.overruns for j in mixed) <= len(mixed) / 3
    per_gpu: dict[str, float] = {}
    for j in drawn["e"].jobs:  # each GPU's jobs add up to at most 60 % SM
        per_gpu[j.name[:-1]] = per_gpu.get(j.name[:-1], 0.0) + j.sm
    assert len(per_gpu) == drawn["e"].gpus and all(BUSY_SM[0] - 0.01 <= sm <= BUSY_SM[1] + 0.01
                                                   for sm in per_gpu.values())


@pytest.mark.slow
def test_quick_goal_e_a_small_job_and_a_cpu_job_beside_busy_gpus(tmp_path):
    scenario = next(s for s in scenarios(35, quick=True) if s.goal == "e")
    results = run_probe_scenario(scenario, tmp_path)
    ok, measured = verdict("e", results)
    assert ok, measured
    assert results["auto"]["busy_still_running"] == len(scenario.jobs)  # it ran beside them, not after


@pytest.mark.slow
def test_quick_goal_a_under_declared_jobs_complete_even_with_no_retries(tmp_path):
    # the hardest of its runs, --retries 0 (the defaults' is tests/daemon/test_e2e_fair_oom.py):
    # two daemons keep it within a minute
    quick = next(s for s in scenarios(35, quick=True) if s.goal == "a")
    scenario = replace(quick, runs=[r for r in quick.runs if r.name in ("exclusive", "auto --retries 0")])
    results = run_queue_scenario(scenario, tmp_path)
    for name in ("exclusive", "auto --retries 0"):
        assert not results[name]["not_done"], (name, results[name]["not_done"])
    assert results["exclusive"]["attempts"] == {j.name: 1 for j in scenario.jobs}  # a plain queue: no crash
