"""The worker as a real process, and the runner with two concurrent CPU workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from collocate.bench import worker
from collocate.bench.plan import Scenario, build_plan
from collocate.bench.runner import RunOptions, read_results, run_plan, run_scenario
from collocate.gpus.emulated import EmulatedBackend


def test_worker_trains_on_cpu_for_about_a_second(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = [sys.executable, "-m", "collocate.bench.worker", "--workload", "resnet18-cifar",
            "--device", "cpu", "--seconds", "1", "--warmup", "0.2", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and doc["device"] == "cpu" and doc["size"] == "tiny"
    assert doc["steps"] >= 1 and 0.9 <= doc["seconds"] < 5
    assert doc["samples_per_s"] == pytest.approx(doc["steps"] * doc["batch_size"] / doc["seconds"])
    assert doc["step_ms"]["p50"] <= doc["step_ms"]["p99"]
    assert doc["time_per_epoch_s"] == pytest.approx(50_000 / doc["samples_per_s"])
    assert doc["max_memory_reserved_mib"] is None  # no CUDA: not a GPU number
    assert "NOT GPU" in doc["note"] and doc["pid"] > 0
    assert doc["measure_start"] < doc["measure_end"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_worker_without_gpu_says_to_use_cpu(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    code = worker.main(["--workload", "dlrm", "--device", "cuda", "--out", str(out)])
    assert code == worker.EXIT_USAGE
    assert "--device cpu" in capsys.readouterr().err
    assert json.loads(out.read_text())["status"] == "error"


def test_worker_fixed_steps_in_process(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert worker.main(["--workload", "transformer-encoder", "--device", "cpu", "--steps", "3",
                        "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "steps" and doc["steps"] == 3 and doc["warmup_steps"] == 0


class RecordingMps:
    def __init__(self, pipe: Path) -> None:
        self.pipe, self.calls = pipe, []

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def client_env(self, **kwargs: object) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe)}


def test_runner_two_concurrent_cpu_workers_on_the_emulated_backend(tmp_path: Path) -> None:
    backend = EmulatedBackend.create(tmp_path / "emu", "1xH100-80GB", node="t")
    uuid = backend.devices()[0].uuid
    opts = RunOptions(device="cpu", seconds=1.0, warmup=0.2, period_s=0.2)
    mps = RecordingMps(tmp_path / "pipe")
    record, raw = run_scenario(Scenario(("dlrm", "resnet18-cifar"), "mps"), backend=backend,
                               uuid=uuid, work_dir=tmp_path / "w", opts=opts, mps=mps)
    assert record["status"] == "ok", record
    jobs = record["jobs"]
    assert [j["workload"] for j in jobs] == ["dlrm", "resnet18-cifar"]
    assert all(j["exit_code"] == 0 and j["samples_per_s"] > 0 for j in jobs)
    assert jobs[0]["pid"] != jobs[1]["pid"]
    start, end = record["window"]
    assert start < end  # both were measuring at the same time (the go signal)
    assert all(j["measure_start"] <= start and j["measure_end"] >= end for j in jobs)
    assert all(j["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "set" for j in jobs)  # the MPS client env
    assert record["gpu"]["n_samples"] >= 1 and raw and record["mps_started"]


def test_run_plan_resumes_skips_what_cannot_fit_and_brackets_mps(tmp_path: Path, monkeypatch) -> None:
    calls: list[str] = []

    def fake_run(scenario, **kw):
        calls.append(scenario.id)
        job = {"workload": scenario.jobs[0], "status": "ok", "pid": 1, "samples_per_s": 10.0,
               "max_memory_reserved_mib": 30_000.0}
        return ({"scenario": scenario.id, "kind": scenario.kind, "sharing": scenario.sharing,
                 "workloads": list(scenario.jobs), "copies": len(scenario.jobs), "status": "ok",
                 "reason": "", "gpu": {}, "jobs": [job] * len(scenario.jobs)}, [])

    monkeypatch.setattr("collocate.bench.runner.run_scenario", fake_run)
    monkeypatch.setattr("collocate.bench.runner.IDLE_SECONDS", 0.05)
    backend = EmulatedBackend.create(tmp_path / "emu", "1xH100-80GB", node="t")
    mps = RecordingMps(tmp_path)
    plan = build_plan(["resnet152", "dlrm"], copies=[1, 2, 3], mixes=[])
    kwargs = dict(backend=backend, uuid=backend.devices()[0].uuid, total_mib=81_559,
                  out_dir=tmp_path / "out", opts=RunOptions(device="cpu"),
                  env_info={"measured_on": "cpu"}, mps_factory=lambda: mps, log=lambda m: None)
    run_plan(plan[:3], **kwargs)
    assert calls == [s.id for s in plan[:3]]
    records = run_plan(plan, resume=True, **kwargs)
    assert calls[3:] == [s.id for s in plan[3:] if len(s.jobs) < 3]  # 3 x 30.6 GB > 0.95 x 80 GB
    assert [r["scenario"] for r in records][0] == "idle"
    assert len(records) == len(plan) + 1
    skipped = [r for r in records if r["status"] == "skipped"]
    assert skipped and all(len(r["workloads"]) == 3 for r in skipped)
    assert mps.calls == ["start", "stop"]  # not started for the skipped 3-copy block
    assert all(r["env"] == {"measured_on": "cpu"} for r in read_results(tmp_path / "out" / "results.jsonl"))


def test_mps_that_cannot_start_fails_its_scenarios_and_the_rest_runs(tmp_path: Path,
                                                                      monkeypatch) -> None:
    from collocate.common.errors import CollocateError

    ran: list[str] = []

    def fake_run(scenario, **kw):
        ran.append(scenario.id)
        return ({"scenario": scenario.id, "kind": scenario.kind, "sharing": scenario.sharing,
                 "workloads": list(scenario.jobs), "copies": len(scenario.jobs), "status": "ok",
                 "reason": "", "gpu": {}, "jobs": []}, [])

    class Broken(RecordingMps):
        def start(self) -> None:
            raise CollocateError("nvidia-cuda-mps-control is not installed")

    monkeypatch.setattr("collocate.bench.runner.run_scenario", fake_run)
    monkeypatch.setattr("collocate.bench.runner.IDLE_SECONDS", 0.05)
    backend = EmulatedBackend.create(tmp_path / "emu", "1xH100-80GB", node="t")
    plan = build_plan(["dlrm"], copies=[1, 2, 3], mixes=[])
    kwargs = dict(backend=backend, uuid=backend.devices()[0].uuid, total_mib=81_559,
                  out_dir=tmp_path / "out", opts=RunOptions(device="cpu"), env_info={},
                  log=lambda m: None)
    records = run_plan(plan, mps_factory=lambda: Broken(tmp_path), **kwargs)
    assert ran == [s.id for s in plan if s.sharing != "mps"]
    failed = [r for r in records if r["status"] == "failed"]
    assert [r["scenario"] for r in failed] == ["mps:2x dlrm", "mps:3x dlrm"]
    assert "not installed" in failed[0]["reason"]
    # a later run with working MPS retries only the failed ones
    records = run_plan(plan, mps_factory=lambda: RecordingMps(tmp_path), resume=True, **kwargs)
    assert ran[-2:] == ["mps:2x dlrm", "mps:3x dlrm"]
    assert sorted(r["status"] for r in records).count("failed") == 0
    assert len(records) == len(plan) + 1
