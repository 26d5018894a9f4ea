"""The GPU measurement script's dry run, the accuracy report generator (on a fixture), and
share_gpu.py's measurement plumbing on the CPU."""

from __future__ import annotations

import csv
import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

from collocate.estimate.entrypoint import resolve

ROOT = pathlib.Path(__file__).parents[2]
FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "ground_truth_fixture.csv"


def _load(name: str) -> ModuleType:
    path = ROOT / "benchmarks" / "gpu" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gt = _load("estimator_ground_truth")
report = _load("estimator_report")
share_gpu = _load("share_gpu")


def test_config_list_is_large_varied_and_resolvable() -> None:
    names = [c.name for c in gt.CONFIGS]
    assert len(names) >= 40 and len(set(names)) == len(names)
    assert {c.family for c in gt.CONFIGS} >= {"mlp", "cnn", "transformer"}
    assert {c.precision for c in gt.CONFIGS} == {"fp32", "fp16", "bf16"}
    assert {c.optimizer for c in gt.CONFIGS} == {"sgd", "adam", "adamw"}
    assert {c.requires for c in gt.CONFIGS} >= {"torchvision", "timm", "transformers"}
    for c in gt.CONFIGS:
        assert callable(resolve(c.entry_point))


def test_dry_run_two_configs(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "gt.csv"
    rc = gt.main(["--dry-run", "--only", "mlp-b256-sgd-fp32", "dlrm-b2048-adam-fp32",
                  "--out", str(out)])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["status"] for r in rows] == ["dry-run", "dry-run"]
    assert all(r["nvml_peak_mib"] == "" and r["torch"] for r in rows)  # nothing invented
    assert rows[0]["device_name"] == "cpu"


def test_allocator_stats_from_memory_stats_keys() -> None:
    # the keys torch.cuda.memory_stats() uses (c10/cuda/CUDACachingAllocator stat names)
    stats = {"reserved_bytes.large_pool.peak": 20 * 2**20, "reserved_bytes.small_pool.peak": 2**21,
             "inactive_split_bytes.all.peak": 3 * 2**19, "segment.all.peak": 7,
             "num_alloc_retries": 0}
    assert gt.allocator_stats(stats) == {
        "large_pool_reserved_mib": 20.0, "small_pool_reserved_mib": 2.0,
        "inactive_split_peak_mib": 1.5, "segments_peak": 7, "alloc_retries": 0}
    assert set(gt.allocator_stats({}).values()) == {None}  # an older torch: empty, not invented


def test_unknown_config_name_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown config"):
        gt.main(["--dry-run", "--only", "nope"])


def test_summary_metrics_by_hand() -> None:
    cases = [report.Case(f"c{i}", "mlp", 100.0, None, {"ours": e, "horus": None, "faketensor": 50.0})
             for i, e in enumerate([95.0, 120.0, 80.0])]
    s = report.summarise(cases, "ours")
    assert s["median_ape"] == pytest.approx(0.20)  # errors 5%, 20%, 20%
    assert s["under_share"] == pytest.approx(1 / 3)  # only 80 is >10% under
    assert s["max_ape"] == pytest.approx(0.20)
    assert report.summarise(cases, "horus") == {"n": 0, "failed": 3}
    assert report.summarise(cases, "faketensor")["under_share"] == 1.0


def test_report_from_fixture(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "accuracy.md"
    assert report.main([str(FIXTURE), "--out", str(out)]) == 0
    text = out.read_text()
    assert "FIXTURE, NOT A MEASUREMENT" in text
    assert "| ours | 3 | 0 |" in text  # the oom row is not a case
    assert "item_model-b8-sgd-fp32" in text and "cpu-run" in text
    assert "faketensor" in text and "Goal" in text


def test_budget_and_resume_write_the_csv_as_they_go(tmp_path: pathlib.Path, monkeypatch,
                                                    capsys) -> None:
    measured: list[str] = []

    def fake_measure(cfg, dry_run, timeout_s=gt.CHILD_TIMEOUT_S, jobs=1):
        measured.append(cfg.name)
        return {"config": cfg.name, "status": "ok", "nvml_peak_mib": 100.0}

    monkeypatch.setattr(gt, "measure", fake_measure)
    names = ["mlp-b256-sgd-fp32", "mlp-b4096-sgd-fp32", "dlrm-b2048-adam-fp32"]
    out = tmp_path / "gt.csv"
    # a budget too small for any configuration: nothing runs, what is left is named
    assert gt.main(["--dry-run", "--only", *names, "--out", str(out), "--budget", "0"]) == 0
    assert measured == [] and "3 configuration(s) left" in capsys.readouterr().out
    assert gt.main(["--dry-run", "--only", names[0], "--out", str(out)]) == 0
    assert [r["config"] for r in csv.DictReader(out.open())] == [names[0]]
    # resume keeps the finished row and measures only the others, into the same file
    assert gt.main(["--dry-run", "--only", *names, "--out", str(out), "--resume", str(out)]) == 0
    assert measured == [names[0], names[1], names[2]]
    rows = list(csv.DictReader(out.open()))
    assert [r["config"] for r in rows] == names and {r["status"] for r in rows} == {"ok"}
    assert not out.with_name(out.name + ".tmp").exists()


def test_parallel_jobs_keep_order_and_remeasure_an_oom_alone(tmp_path: pathlib.Path,
                                                             monkeypatch) -> None:
    calls: list[tuple[str, int]] = []

    def fake_measure(cfg, dry_run, timeout_s=gt.CHILD_TIMEOUT_S, jobs=1):
        calls.append((cfg.name, jobs))
        oom = cfg.name == "mlp-b4096-sgd-fp32" and jobs > 1  # only beside the others
        return {"config": cfg.name, "status": "oom" if oom else "ok", "jobs": jobs}

    monkeypatch.setattr(gt, "measure", fake_measure)
    names = ["mlp-b256-sgd-fp32", "mlp-b4096-sgd-fp32", "dlrm-b2048-adam-fp32"]
    out = tmp_path / "gt.csv"
    assert gt.main(["--dry-run", "--only", *names, "--out", str(out), "--jobs", "3"]) == 0
    assert sorted(calls[:3]) == sorted((n, 3) for n in names)
    assert calls[3:] == [("mlp-b4096-sgd-fp32", 1)]
    rows = list(csv.DictReader(out.open()))
    assert [r["config"] for r in rows] == names  # the configurations' order, not finishing order
    assert [(r["status"], r["jobs"]) for r in rows] == [("ok", "3"), ("ok", "1"), ("ok", "3")]


def test_a_real_parallel_dry_run(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "gt.csv"
    names = ["mlp-b256-sgd-fp32", "dlrm-b2048-adam-fp32"]
    assert gt.main(["--dry-run", "--only", *names, "--out", str(out), "--jobs", "2"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["config"], r["status"], r["jobs"]) for r in rows] == [
        (names[0], "dry-run", "2"), (names[1], "dry-run", "2")]


@pytest.mark.slow
def test_share_gpu_single_loader_measures_on_cpu(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))  # the spawned consumer imports share_gpu
    samples_per_s, split = share_gpu.throughput("independent", 1, 1, "cpu", 0.5, 1.0, 0)
    assert samples_per_s > 0
    assert set(split) == {"start_to_first_batch", "warmup_and_window", "teardown"}
    assert split["warmup_and_window"] >= 1.5 and split["teardown"] < 5


def test_allocator_probe_summarizes_a_snapshot() -> None:
    """The probe's reading of ``torch.cuda.memory._snapshot()``: each new segment is charged to
    the allocation that made it, by the library on that allocation's C++ stack."""
    probe = _load("allocator_probe")
    mib = 2**20
    cudnn = [{"name": "at::native::cudnn_convolution_forward", "filename": "", "line": 0}]
    snapshot = {
        "device_traces": [[
            {"action": "segment_alloc", "size": 20 * mib},
            {"action": "alloc", "size": 9 * mib, "frames": []},
            {"action": "alloc", "size": 1 * mib, "frames": []},  # fits the cached segment
            {"action": "segment_map", "size": 40 * mib},  # expandable: a mapping, same meaning
            {"action": "alloc", "size": 33 * mib, "frames": cudnn},
            {"action": "free_completed", "size": 33 * mib},
        ]],
        "segments": [{"total_size": 20 * mib, "allocated_size": 10 * mib},
                     {"total_size": 40 * mib, "allocated_size": 0}],
    }
    out = probe.summarize(snapshot)
    assert out["segments_created"] == [
        {"segment_mib": 20.0, "for_alloc_mib": 9.0, "by": "torch"},
        {"segment_mib": 40.0, "for_alloc_mib": 33.0, "by": "cudnn"}]
    assert out["segments_created_by"] == {"cudnn": 40.0, "cublas": 0, "torch": 20.0}
    assert (out["reserved_at_end_mib"], out["allocated_at_end_mib"]) == (60.0, 10.0)
    assert (out["cudnn_allocs"], out["cudnn_largest_mib"], out["cublas_allocs"]) == (1, 33.0, 0)
