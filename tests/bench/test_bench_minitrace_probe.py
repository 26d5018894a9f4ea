"""Mini-trace files (loaded by the simulator's trace reader), the comparison table, an emulated
replay through the real daemon, the NVML probe's dry run, and the report files."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from collocate.bench.minitrace import build_files, build_minitrace, read_jobs_json
from collocate.bench.minitrace_run import compare, run_minitrace
from collocate.bench.report import markdown, write_all
from collocate.sim.trace import load_trace

from ._records import PROFILES, synthetic_records

ROOT = Path(__file__).resolve().parents[2]


def test_minitrace_files_load_in_the_simulator(tmp_path: Path) -> None:
    records = synthetic_records()
    for r in records:  # profiles and memory count as measured on a GPU
        r["env"] = {**r["env"], "measured_on": "cuda"}
    paths = build_files(records, tmp_path, source="results.jsonl", n_jobs=12, seed=7)
    assert [p.name for p in paths] == ["trace.csv", "jobs.json", "submit.sh"]
    trace = load_trace(tmp_path / "trace.csv")
    assert len(trace) == 12
    assert {t.workload.name.rsplit("-", 1)[0] for t in trace} == set(PROFILES)  # every workload
    arrivals = [t.arrival_s for t in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0 and arrivals[-1] > 0
    jobs, doc = read_jobs_json(tmp_path / "jobs.json")
    for t, j in zip(trace, jobs, strict=True):
        solo_steps = PROFILES[j.workload][2] / 64
        # start-up + the warm-up steps' extra cost + the steps at the steady rate
        assert t.workload.duration_s == pytest.approx(6.0 + 2.0 + j.steps / solo_steps, abs=0.01)
        assert t.workload.warmup_s == j.warmup_s == pytest.approx(2.0)  # run without activity
        assert t.workload.peak_mib == 4000.0 and j.mem_source == "measured"
        assert t.workload.profile.sm_activity == PROFILES[j.workload][0]
        assert j.profile_source == "measured"
    assert "note" not in doc
    script = (tmp_path / "submit.sh").read_text()
    assert script.count("collocate submit") == 12 and "-m collocate.bench.worker" in script
    subprocess.run(["bash", "-n", str(tmp_path / "submit.sh")], check=True)
    assert build_minitrace(records, seed=7) == jobs  # seeded: the same trace again


def test_cpu_results_make_a_labelled_dry_run_trace(tmp_path: Path) -> None:
    records = [{**r, "env": {"measured_on": "cpu"}} for r in synthetic_records()]
    build_files(records, tmp_path, source="cpu.jsonl", n_jobs=3)
    jobs, doc = read_jobs_json(tmp_path / "jobs.json")
    assert "not GPU numbers" in doc["note"]
    assert all(j.profile_source.startswith("assumed") for j in jobs)


def test_compare_table() -> None:
    real = [{"policy": "auto", "sharing": "mps", "source": "real", "makespan_min": 10.0,
             "mean_jct_min": 4.0, "sm_util": 0.7, "energy_kwh": 0.05, "oom_crashes": 0}]
    sim = [{"sharing": "mps", "policies": [{"policy": "auto", "makespan_min": 11.0,
                                             "mean_jct_min": 4.4, "sm_util": 0.8,
                                             "energy_kwh": 0.06, "oom_crashes": 1}]}]
    text = compare(real, sim, {"device_name": "X", "measured_on": "cuda"})
    assert "| auto | mps | 10 | 11 | 4 | 4.4 |" in text and "+10%" in text


def test_emulated_replay_through_the_daemon(tmp_path: Path) -> None:
    records = synthetic_records()
    build_files(records, tmp_path / "t", source="s", n_jobs=2, seed=1, mean_gap_s=1.0)
    jobs, _ = read_jobs_json(tmp_path / "t" / "jobs.json")
    summary = run_minitrace(jobs, policy="exclusive", sharing="time-slicing",
                            gpus="emulated:1xH100-80GB", out_dir=tmp_path / "run", emulate=True,
                            time_scale=0.02, period_s=0.2, log=lambda m: None)
    assert summary["jobs"] == 2 and summary["done"] == 2 and summary["oom_crashes"] == 0
    assert summary["makespan_min"] > 0 and summary["source"] == "emulated"
    rows = json.loads((tmp_path / "run" / "ls.json").read_text())
    assert sorted(r["name"] for r in rows) == sorted(j.name for j in jobs)
    assert (tmp_path / "run" / "samples.jsonl").read_text().strip()
    # the daemon's log keeps each attempt's outcome and activity, for the runbook's checks
    log = (tmp_path / "run" / "daemon.log").read_text()
    assert log.count("; activity ") == 2, log


def test_nvml_probe_dry_run(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("nvml_probe", ROOT / "benchmarks/gpu/nvml_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (doc_path,) = tmp_path.glob("nvml-probe-dry-run-*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["dry_run"] and doc["capabilities"]["gpm"] == "ok"
    assert doc["reacts_to_load"]["sm_activity"] is True and doc["worker_memory_seen"]
    assert "DRY RUN" in doc_path.with_suffix(".md").read_text()


def test_report_files(tmp_path: Path) -> None:
    records = synthetic_records()
    paths = write_all(records, tmp_path)
    assert {p.name for p in paths} == {"summary.csv", "table.md", "slowdown.png", "scaling.png"}
    csv_text = (tmp_path / "summary.csv").read_text()
    assert csv_text.splitlines()[0].endswith("device_name,driver,cuda,torch,date_utc,measured_on")
    table = markdown(records)
    assert "| resnet152+dlrm |" in table and "NVIDIA H100 80GB HBM3" in table
