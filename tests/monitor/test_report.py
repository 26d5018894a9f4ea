"""`collocate report`: the summary numbers, the files, and the --since parsing."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from collocate.cli import app
from collocate.common.errors import InputError
from collocate.monitor.report import build_report, parse_since, summary_lines
from collocate.monitor.store import MonitorStore, monitor_db_path

from .test_store import run_ticks


def test_report_files_and_numbers(tmp_path):
    store = MonitorStore(tmp_path / "m.sqlite")
    run_ticks(store, 11)
    report = build_report(store, tmp_path / "out")
    names = sorted(f.name for f in report.files)
    assert names == ["energy.png", "gpu_timeline.png", "summary.json", "summary.md",
                     "utilization.png"]
    for f in report.files:
        assert f.stat().st_size > 0
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {u["user"]: u["jobs"] for u in data["users"]} == {"ann": 1, "bob": 1}
    assert sum(u["energy_wh"] for u in data["users"]) == pytest.approx(3000 / 3600)
    assert data["gpus"][0]["energy_wh"] == pytest.approx(3000 / 3600)
    assert data["gpus"][0]["jobs"] == ["1", "2"]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| ann | 1 |" in md and "| n:0 | 0.83 |" in md
    window = build_report(store, tmp_path / "w", since=1005.0)
    assert sum(j.energy_wh for j in window.jobs) == pytest.approx(6 * 300 / 3600)
    lines = summary_lines(store.job_summary("1"))
    assert lines[1].endswith("60%") and "Wh" in lines[3]


def test_parse_since():
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("1.5d", now=200_000.0) == 200_000.0 - 1.5 * 86400
    assert parse_since("1700000000") == 1.7e9
    assert parse_since("2026-11-20T08:00:00+00:00") == 1795161600.0
    with pytest.raises(InputError, match="24h or 7d"):
        parse_since("yesterday")


def test_cli_report(tmp_path):
    store = MonitorStore(monitor_db_path(tmp_path))
    run_ticks(store, 3)
    store.close()
    runner = CliRunner()
    result = runner.invoke(app, ["report", "--state-dir", str(tmp_path), "--out",
                                 str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "2 job(s), 2 user(s), 1 GPU(s)" in result.output
    assert (tmp_path / "r" / "gpu_timeline.png").exists()
    as_json = runner.invoke(app, ["report", "--state-dir", str(tmp_path), "--out", str(tmp_path / "j"),
                                  "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    summary = json.loads(as_json.output)
    assert summary == {**json.loads((tmp_path / "j" / "summary.json").read_text()), "files": summary["files"]}
    assert len(summary["jobs"]) == 2 and str(tmp_path / "j" / "gpu_timeline.png") in summary["files"]
    missing = runner.invoke(app, ["report", "--state-dir", str(tmp_path / "none")])
    assert missing.exit_code != 0


def test_timeline_segments_and_lanes():
    from collocate.common.gantt import lanes
    from collocate.monitor.report import _segments

    rows = [{"t": 0.0, "jobs": ["1"]}, {"t": 1.0, "jobs": ["1", "2"]}, {"t": 2.0, "jobs": ["2"]},
            {"t": 3.0, "jobs": []}, {"t": 4.0, "jobs": ["3"]}]
    segments = sorted(_segments(rows))
    assert segments == [("1", (0.0, 1.0)), ("2", (1.0, 2.0)), ("3", (4.0, 4.0))]
    placed = {job: lane for job, _, lane in lanes(segments)}
    assert placed == {"1": 0, "2": 1, "3": 0}  # 1 and 2 overlap at t=1; 3 reuses lane 0


def test_energy_bars_show_every_job_or_the_rest_as_others():
    from collocate.monitor.report import ENERGY_BARS, energy_bars
    from collocate.monitor.store import JobSummary

    def job(i: int) -> JobSummary:
        return JobSummary(str(i), "ann", f"j{i}", 0.0, 1.0, 1.0, 0.5, 0.1, 0.1, float(i), 0.1,
                          1.0, ("g0",))

    few = [job(i) for i in range(1, 4)]
    assert energy_bars(few) == (["3", "2", "1"], [3.0, 2.0, 1.0])
    many = [job(i) for i in range(1, 101)]
    labels, values = energy_bars(many)
    assert len(labels) == ENERGY_BARS and labels[0] == "100" and labels[-1] == "others"
    assert sum(values) == sum(j.energy_wh for j in many)  # nothing dropped silently


def test_report_gives_each_job_its_sacct_fields_from_the_job_store(tmp_path):
    """A CPU job on emulated GPUs holds no GPU memory: the report still says what it did
    (state, exit code, GPUs, wait, run time, GPUs held x hours), and why the measured columns
    are empty, rather than a table of zeros."""
    from collocate.core.model import Job, JobState
    from collocate.daemon.store import Attempt, Store
    from collocate.wire.spec import JobSpec

    store = Store(tmp_path / "collocate.common.sqlite")
    for job_id, state, code in (("1", JobState.DONE, 0), ("2", JobState.FAILED, 3)):
        store.add_job(Job(job_id, submit_time=100.0, name=f"train{job_id}", user="ann"),
                      JobSpec(("python", "train.py"), "/", user="ann"))
        store.add_attempt(Attempt(job_id, 1, 160.0, ("n:0",), ("GPU-0",), "/x"))
        store.update_attempt(Attempt(job_id, 1, 160.0, ("n:0",), ("GPU-0",), "/x", end=3760.0,
                                     returncode=code, outcome="succeeded"))
        store.save_job(Job(job_id, submit_time=100.0, name=f"train{job_id}", user="ann", state=state))
    store.close()
    MonitorStore(monitor_db_path(tmp_path)).close()
    result = CliRunner().invoke(app, ["report", "--state-dir", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r" / "summary.md").read_text()
    assert "| 2 | ann | train2 | failed | 3 | n:0 | 1:00 | 1:00:00 | - | - | - | - |" in md
    assert "| ann | 2 | 0.000 | 0.00 | 0.000 | 2.000 | 1:00 |" in md  # 2 GPU-hours held
    assert "No job was seen holding GPU memory" in md
