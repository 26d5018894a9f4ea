"""The simulator's plots and CSV: per-attempt spans, the Gantt chart's bars and OOM markers."""

from __future__ import annotations

import csv

from collocate.core.gputypes import parse_cluster
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.report import gantt_bars, write_jobs_csv, write_plots
from collocate.sim.synth import synthetic_trace


def simulate(policy: str, jobs: int = 60, seed: int = 3):
    trace = synthetic_trace(jobs, gpus=4, seed=seed)
    return Simulation(parse_cluster("4xA100-40GB"), trace, make_policy(policy), SimConfig()).run()


def test_spans_match_attempts_and_ooms_and_become_gantt_bars():
    result = simulate("shares")
    assert sum(r.oom_crashes for r in result.records) > 0  # the scenario has OOM crashes
    for r in result.records:
        assert len(r.spans) == r.attempts, r
        assert sum(s[3] == "oom" for s in r.spans) == r.oom_crashes, r
        assert all(s[2] is not None and s[2] >= s[1] for s in r.spans if r.state == "done")
    bars, gpus = gantt_bars(result)
    assert sorted(gpus) == sorted({g for r in result.records for s in r.spans
                                   for g in s[0].split(",")})
    assert sum(b.outcome == "oom" for b in bars) == sum(
        sum(s[3] == "oom" for s in r.spans) * len(r.spans[0][0].split(",")) for r in result.records
        if r.spans)
    assert all(0 <= b.start <= b.end <= result.makespan_s / 60 + 1e-9 for b in bars)
    few, _ = gantt_bars(result, max_gpus=2)
    assert len({b.gpu for b in few}) == 2


def test_plots_and_csv_without_float_noise(tmp_path):
    results = [simulate("exclusive", 20), simulate("shares")]
    written = write_plots(results, tmp_path)
    assert [p.name for p in written] == ["jct_cdf.png", "timeline_exclusive.png",
                                         "timeline_shares.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 10_000 for p in written)
    write_jobs_csv(results, tmp_path / "jobs.csv")
    rows = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert len(rows) == 80
    for row in rows:
        for key in ("submit_s", "start_s", "end_s", "peak_mib", "mem_mib"):
            value = row[key]
            assert value == "" or len(value.partition(".")[2]) <= 1, (key, value)
