"""The plumbing of the GPU rounds: run_plan's time budget, an interrupted mini-trace, the
comparison table, and benchmarks/gpu's round/unpack/envcheck scripts rehearsed on the CPU."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path

import psutil
import pytest

from collocate.bench.minitrace import build_files, read_jobs_json
from collocate.bench.minitrace_run import compare, run_minitrace
from collocate.bench.plan import build_plan
from collocate.bench.runner import RunOptions, run_plan
from collocate.gpus.emulated import EmulatedBackend

from ._records import synthetic_records

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"


def test_budget_counts_the_longest_scenario_seen_not_only_the_static_estimate(
        tmp_path: Path, monkeypatch) -> None:
    now = [0.0]
    took = {1: 10.0, 2: 100.0}  # seconds per scenario by process count (fake clock)
    ran: list[str] = []

    def fake_run(scenario, **kw):
        ran.append(scenario.id)
        now[0] += took[len(scenario.jobs)]
        return ({"scenario": scenario.id, "kind": scenario.kind, "sharing": scenario.sharing,
                 "workloads": list(scenario.jobs), "copies": len(scenario.jobs), "status": "ok",
                 "reason": "", "gpu": {}, "jobs": []}, [])

    monkeypatch.setattr("collocate.bench.runner.run_scenario", fake_run)
    monkeypatch.setattr("collocate.bench.runner.IDLE_SECONDS", 0.01)
    backend = EmulatedBackend.create(tmp_path / "emu", "1xH100-80GB", node="t")
    plan = build_plan(["dlrm", "resnet18-cifar"], copies=[1, 2], mixes=[],
                      sharing=["time-slicing"])
    # static estimate: 12 + 5 + 10 = 27 s per scenario
    run_plan(plan, backend=backend, uuid=backend.devices()[0].uuid, total_mib=81_559,
             out_dir=tmp_path / "out", opts=RunOptions(device="cpu", seconds=10, warmup=5),
             env_info={}, budget_s=150.0, log=lambda m: None, clock=lambda: now[0])
    # 2 alone (20 s), the first pair ends at 120 s; a second pair would end at 220 s > 150 s
    # (the static 27 s alone would have started it)
    assert ran == ["alone:dlrm", "alone:resnet18-cifar", "time-slicing:2x dlrm"]


def test_an_interrupted_minitrace_cancels_its_jobs(tmp_path: Path, monkeypatch) -> None:
    tag = f"test-{uuid.uuid4()}"
    monkeypatch.setenv("COLLOCATE_TEST_TAG", tag)  # the daemon's jobs inherit the submitter's env
    build_files(synthetic_records(), tmp_path / "t", source="s", n_jobs=2, seed=1, mean_gap_s=0.5)
    jobs, _ = read_jobs_json(tmp_path / "t" / "jobs.json")
    messages: list[str] = []

    def log(msg: str) -> None:
        messages.append(msg)
        if msg.startswith("0/2 jobs ended"):
            raise KeyboardInterrupt  # as Ctrl-C or round.sh's time limit would

    with pytest.raises(KeyboardInterrupt):
        run_minitrace(jobs, policy="exclusive", sharing="time-slicing",
                      gpus="emulated:1xH100-80GB", out_dir=tmp_path / "run", emulate=True,
                      time_scale=1.0, period_s=0.2, log=log)
    assert any(m.startswith("cancelling") for m in messages), messages
    left = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info["environ"] or {}).get("COLLOCATE_TEST_TAG") == tag and p.pid != os.getpid():
                left.append(p)
        except psutil.Error:
            continue
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_time_scale_note_stays_outside_the_table() -> None:
    real = [{"policy": "auto", "sharing": "mps", "source": "emulated", "makespan_min": 1.0,
             "time_scale": 0.05}]
    lines = compare(real, [], {}).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| policy"))
    assert lines[header + 1].startswith("|---") and lines[header + 2].startswith("| auto")
    assert any("time scale" in line for line in lines[:header])


# ------------------------------------------------------------------ benchmarks/gpu scripts
def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wheel(folder: Path, name: str, version: str, tags: str, requires: list[str]) -> None:
    with zipfile.ZipFile(folder / f"{name}-{version}-{tags}.whl", "w") as z:
        meta = [f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
        z.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")


def test_wheel_check(tmp_path: Path, capsys) -> None:
    envcheck = _load("envcheck")
    _wheel(tmp_path, "tensorsocket", "0.0.5", "py3-none-any",
           ["pyzmq >= 25.0.0", "torch >= 2.0.0", "sphinx; extra == 'docs'"])
    _wheel(tmp_path, "pyzmq", "27.3.0", "cp312-abi3-manylinux_2_28_x86_64",
           ['cffi; implementation_name == "pypy"'])
    assert envcheck.wheels(tmp_path) == 0  # torch is in the image; cffi only on PyPy
    _wheel(tmp_path, "pyzmq", "26.0.0", "cp311-cp311-manylinux_2_28_x86_64", [])
    _wheel(tmp_path, "tornado", "6.6.1", "cp311-abi3-macosx_10_9_x86_64", ["nonexistent-pkg"])
    assert envcheck.wheels(tmp_path) == 1
    out = capsys.readouterr().out
    assert "pyzmq: 2 versions" in out and "cp311/cp311 does not fit" in out
    assert "macosx" in out and "nonexistent-pkg" in out


def test_round_script_refuses_bad_calls_and_touches_no_gpu_settings(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    for argv in (["A2", str(tmp_path / "nothing")], ["B1", str(tmp_path)], ["D2", str(tmp_path)], ["Z9"]):
        proc = subprocess.run(["bash", str(GPU / "round.sh"), "--rehearse", *argv], env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 2, argv
    proc = subprocess.run(["bash", str(GPU / "round.sh"), "A1"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OUT"}, timeout=30,
                          check=False)
    assert proc.returncode == 2 and "OUT" in proc.stderr
    for script in ("round.sh", "unpack.sh", "rehearse_all.sh"):
        text = (GPU / script).read_text()
        calls = re.findall(r"nvidia-smi\s+-[^\n|;)]*", text)  # nvidia-smi with options
        assert calls or script != "round.sh"
        for line in calls:  # queries only: never -c/-mig/-r (compute mode, MIG, reset)
            assert line.split()[1].startswith("--query-"), line


def test_round_check_rehearsal_packs_and_unpacks(tmp_path: Path) -> None:
    out, results = tmp_path / "out", tmp_path / "results"
    env = {**os.environ, "OUT": str(out), "ROUND_BUDGET": "60", "RESULTS": str(results),
           "PYTHON": sys.executable}  # this test's interpreter, never whatever python3 PATH finds
    proc = subprocess.run(["bash", str(GPU / "round.sh"), "--rehearse", "CHECK"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["CHECK.log", "CHECK.md", "CHECK.tgz"]
    with tarfile.open(out / "CHECK.tgz") as tar:
        names = tar.getnames()
    assert "./meta.env" in names and "./summary.md" in names
    assert "REHEARSAL" in (out / "CHECK.md").read_text()
    log = (out / "CHECK.log").read_text()
    assert "blocked (not on the device)" in log and "collocate.cli" in log
    proc = subprocess.run(["bash", str(GPU / "unpack.sh"), "CHECK", str(out)], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    first = list((results / "gpu-rounds").glob("*-rehearsal-cpu-CHECK.md"))
    assert len(first) == 1
    # unpacking the same call again changes nothing; another call of that name and date (here:
    # an edited summary) keeps the first one's files and is named by its start time
    for edit in ("", "another call\n"):
        (out / "CHECK.md").write_text((out / "CHECK.md").read_text() + edit)
        proc = subprocess.run(["bash", str(GPU / "unpack.sh"), "CHECK", str(out)], env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr
    names = {p.name for p in (results / "gpu-rounds").glob("*.md")} - {first[0].name}
    assert len(names) == 1 and names.pop().startswith(first[0].stem + "-")
    assert "another call" not in first[0].read_text()
    # a rehearsal's files never land in the repo's results
    env.pop("RESULTS")
    proc = subprocess.run(["bash", str(GPU / "unpack.sh"), "CHECK", str(out)], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1 and "rehearsal" in proc.stderr


def test_sigrun_turns_sigterm_into_keyboard_interrupt(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import os, signal, time\n"
                      "try:\n    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
                      "except KeyboardInterrupt:\n    print('cleaned up')\n")
    proc = subprocess.run([sys.executable, str(GPU / "sigrun.py"), str(script)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0 and "cleaned up" in proc.stdout
