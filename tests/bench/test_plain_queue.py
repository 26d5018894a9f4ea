"""benchmarks/plain_queue.py: the mix it submits is what issue 35 asks for, and its quick run
goes end to end (two real daemons on emulated GPUs, real jobs) and reports every goal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from plain_queue import GIB, TRACE_S, WaitTrace, fits, make_mix, most_at_once  # noqa: E402


def test_the_mix_is_the_issues():
    mix = make_mix()
    gpu = [j for j in mix if j.gpus and j.kind != "probe"]
    assert len(gpu) >= 50 and make_mix() == mix  # seeded
    assert 0 < sum(j.overruns for j in gpu) <= len(gpu) / 3
    for j in gpu:
        if j.kind == "under":  # declares 2-4 GiB, needs up to 10x, at most 30 GiB, late
            assert 2 * GIB <= j.declared_mib <= 4 * GIB and j.need_mib <= min(30 * GIB, 10 * j.declared_mib)
            assert 0.5 <= j.peak_at <= 0.8 and j.overruns
        if j.kind in ("honest", "late"):
            assert not j.overruns
        assert j.startup_s > 0 and j.warmup_s > 0 and j.ramp_s > 0  # looks like a real job
    assert any(j.kind == "no-mem" and j.declared_mib is None for j in mix)
    assert sum(j.kind == "cpu" and j.gpus == 0 for j in mix) == 4
    probe = next(j for j in mix if j.kind == "probe")
    assert probe.argv() == ["sleep", "1"] and probe.declared_mib == GIB


def test_a_job_fits_a_gpus_room_only_where_memory_both_measured_and_committed_and_load_leave_it():
    # (room: min(measured free, total - committed - other), SM read lately) per GPU
    need = 8 * GIB
    assert fits(need, [(10 * GIB, 0.3)], load=True)
    # a GPU whose jobs have committed memory they have not allocated yet: measured free is not room
    assert not fits(need, [(6 * GIB, 0.3)], load=False)
    # memory but no room for load (reads 60 % SM or more): it fits memory only
    busy = [(30 * GIB, 0.8), (4 * GIB, 0.2)]
    assert fits(need, busy, load=False) and not fits(need, busy, load=True)
    # both on one GPU, not memory on one and load on another
    assert not fits(need, [(30 * GIB, 0.9), (2 * GIB, 0.1)], load=True)


def test_a_fitted_jobs_wait_is_split_by_the_daemons_reasons_and_the_rest_is_to_its_round():
    trace = WaitTrace.__new__(WaitTrace)  # its samples, without a daemon to read them from
    room, busy = [(20 * GIB, 0.3)], [(20 * GIB, 0.9)]  # a GPU with room under / over 60 % SM
    trace.need = {"1": 4 * GIB, "2": 4 * GIB}
    trace.seen = {"1": [(10.2, "slowdown", "on vm:0 it would slow ...", room),
                        (10.2 + TRACE_S, "slowdown", "", busy), (10.2 + 2 * TRACE_S, "memory", "no GPU has room", [])]}
    split = trace.breakdown({"id": "1", "submit_time": 10.0, "attempts": [{"start": 12.0}]})
    assert split["by_kind_s"] == {"slowdown, room < 60% SM": TRACE_S, "slowdown, GPUs busy": TRACE_S,
                                  "memory": 2.0 - 0.2 - 2 * TRACE_S}  # the last, until it started
    assert split["reasons"]["slowdown, room < 60% SM"].startswith("on vm:0")
    assert split["wait_s"] == 2.0 and split["unseen_s"] == pytest.approx(0.2)  # to its first sample
    never = trace.breakdown({"id": "2", "submit_time": 10.0, "attempts": [{"start": 10.3}]})
    assert never["by_kind_s"] == {} and never["unseen_s"] == 0.3  # placed by the next round


def test_most_at_once_counts_overlapping_attempts():
    details = {"a": {"attempts": [{"start": 0.0, "end": 10.0}]},
               "b": {"attempts": [{"start": 1.0, "end": 2.0}, {"start": 5.0, "end": 6.0}]},
               "c": {"attempts": [{"start": 5.5, "end": 7.0}]}}
    assert most_at_once(details) == 3


@pytest.mark.slow
def test_the_quick_run_reports_every_goal(tmp_path):
    out = tmp_path / "pq"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plain_queue.py"), "--quick", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert set(doc["results"]) == {"exclusive", "auto"} and len(doc["goals"]) == 8
    ex = doc["results"]["exclusive"]
    assert not ex["not_done"] and ex["versus_exclusive"]["max"] == 1.0  # the baseline against itself
    for r in doc["results"].values():
        assert len(r["states"]) == len(doc["mix"]) and r["cpu_start_s"]["n"] == 2
        assert r["probe_end_s"] is not None and r["makespan_s"] > 0
    assert "| goal (issue 35) | met | measured |" in out.with_suffix(".md").read_text()


def test_first_run_reports_each_batch_job_by_job_against_exclusive():
    """benchmarks/first_run.py's new columns: each run's jobs against exclusive's, through the
    simulator's function; a run kept from before the completion times were recorded gets '-'."""
    from first_run import add_versus_exclusive, completion_times, versus_cell

    shown = {"a": {"state": "done", "submit_time": 0.0, "end_time": 10.0},
             "b": {"state": "failed", "submit_time": 0.0, "end_time": 3.0}}
    assert completion_times(shown) == {"a": 10.0, "b": None}
    exclusive = {"first": {"completion_s": {"a": 10.0, "b": 20.0}}, "returning": {"completion_s": {"a": 5.0}}}
    runs = [{"daemon": exclusive},
            {"daemon": {"first": {"completion_s": {"a": 15.0, "b": 10.0}}, "returning": {}}}]
    add_versus_exclusive(runs, exclusive)
    first = runs[1]["daemon"]["first"]
    assert first["versus_exclusive"]["max"] == 1.5 and first["versus_exclusive"]["worse"] == 1
    assert versus_cell(first) == "1.00 / 1.45 / 1.50 (1)" and versus_cell(runs[1]["daemon"]["returning"]) == "-"
