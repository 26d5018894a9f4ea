"""benchmarks/gpu/first_run_gpu.py's dry run: the GPU session's whole pipeline, on the CPU.

Real processes throughout: `collocate estimate` for each job, a `collocate serve` on an emulated
H100 per run, `collocate submit` for each job, real (tiny) PyTorch training jobs, and the second
submission with the first run's history. What the GPU session would find broken shows here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"


@pytest.mark.slow
def test_the_dry_run_estimates_submits_and_reports_a_first_run_and_a_second_with_history(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # the jobs run `python3` from PATH, as a user's would: this interpreter's first
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": path, "HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, str(GPU / "first_run_gpu.py"), "--dry-run", "--runs",
                          "exclusive,auto,auto-mps-history", "--out", str(out)],
                         capture_output=True, text=True, timeout=400, env=env, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in doc["runs"]] == ["exclusive", "auto", "auto-mps-history"]
    jobs = doc["trace"]["jobs"]
    # memory from the real `collocate estimate`; one job without --mem, one declaring half
    assert all(j["estimate_mib"] > 0 and j["estimate_method"] for j in jobs)
    assert sorted(j["declared"] for j in jobs) == ["--estimate", "half its estimate", "no --mem"]
    under = next(j for j in jobs if j["declared"] == "half its estimate")
    assert under["declared_mib"] == round(under["estimate_mib"] / 2)
    for run in doc["runs"]:
        assert run["done"] == run["jobs"] == len(jobs), run
        assert run["makespan_s"] > 0 and run["most_at_once"] >= 1
        assert {j["name"] for j in run["per_job"]} == {j["name"] for j in jobs}
    # an estimated job is submitted as `submit --estimate` submits it: an estimate the daemon may
    # give up for the job's peak, not a declaration
    first = {j["name"]: j for j in doc["runs"][0]["per_job"]}
    for j in jobs:
        if j["declared"] == "--estimate":
            assert first[j["name"]]["mem_source"] == f"static-{j['estimate_method']}"
            assert first[j["name"]]["mem_mib"] == pytest.approx(j["estimate_mib"])
    # the default daemon shares by MPS for one user, and the same user's resubmission with new
    # output paths finds its history by the job's identity
    auto = doc["runs"][1]
    assert auto["resolved_sharing"] == "mps" and auto["again"]["jobs"] == len(jobs)
    assert all(j["mem_source"] == "history" for j in auto["again"]["per_job"]), auto["again"]["per_job"]
    # the second submission was judged with the exclusive run's history: same command, measured memory
    second = doc["runs"][2]["per_job"]
    assert any(j["mem_source"] == "history" for j in second), second
    assert (out / "history.sqlite").stat().st_size > 0
    # the daemon's reasons were sampled while jobs waited
    snaps = [json.loads(line) for line in (out / "exclusive" / "snapshots.jsonl").read_text().splitlines()]
    waits = [r for s in snaps for r in s["rows"] if r["state"] == "pending"]
    assert waits and all(r["reason"] for r in waits)
    # each job trained and said so on its stdout, kept after the daemon's state is gone
    logs = sorted((out / "exclusive" / "job-logs").glob("*.stdout"))
    assert len(logs) == len(jobs) and all('"train_s"' in p.read_text() for p in logs)
    assert "DRY RUN" in (out / "summary.md").read_text()
    assert doc["simulator"] and doc["simulator"][0]["run"] == "exclusive"
