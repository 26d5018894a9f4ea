"""End to end: monitoring wired into a real daemon on emulated GPUs.

A job run under the daemon gets ``COLLOCATE_METRICS_FILE``, its own ``log_metric`` values are
stored, ``collocate show`` prints its measured summary (energy and GPU-hours above zero), the
daemon's dashboard serves its GPUs, jobs and Prometheus ``/metrics`` with per-GPU and per-job
series (behind the random token the daemon makes once and keeps, which ``collocate dashboard-url`` prints for
the owner, or with none at all after ``--no-dashboard-token``), and ``--mlflow`` records one
MLflow run per job in the local store under the state dir.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from daemon_harness import HERE, wait_for

from collocate.monitor.store import MonitorStore, monitor_db_path

METRIC_JOB = str(HERE / "metric_job.py")


def metric_job(mem_mib: float, seconds: float) -> list[str]:
    return [sys.executable, METRIC_JOB, str(mem_mib), str(seconds)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, token: str | None = None) -> str:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.read().decode()


def status_of(url: str, token: str | None = None) -> int:
    try:
        get(url, token)
        return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def cli(d, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir)}
    return subprocess.run([sys.executable, "-m", "collocate.daemon", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_dashboard_metrics_summary_and_logged_metrics(daemons):
    port = free_port()
    d = daemons("--dashboard", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    token = (d.state_dir / "dashboard.token").read_text().strip()
    job = d.submit(metric_job(1500, 3.0), mem="2GiB", name="logger")
    d.wait_state(job, "running")

    def scrape() -> str | None:
        text = get(f"{base}/metrics", token)
        mine = [line for line in text.splitlines()
                if line.startswith("collocate_job_gpu_memory_bytes{") and f'job="{job}"' in line]
        return text if mine and float(mine[0].split()[-1]) > 0 else None

    text = wait_for(scrape, 20, "the running job's series at /metrics")
    assert 'collocate_gpu_memory_used_bytes{gpu="' in text  # per GPU
    assert f'collocate_job_energy_joules_total{{job="{job}"' in text  # per job
    assert 'collocate_tracking_degraded{sink="store"} 0.0' in text
    assert 'collocate_jobs{state="running"} 1.0' in text  # queue metrics, from the daemon's rows
    assert "collocate_placements_total 1.0" in text and "collocate_oom_crashes_total 0.0" in text
    gpus = json.loads(get(f"{base}/api/gpus", token))  # the daemon's own GPUs, through its loop
    assert [g["type"] for g in gpus] == ["A100-40GB", "A100-40GB"]
    assert any(job in g["jobs"] for g in gpus)
    held = [g["job_mib"][job] for g in gpus if job in g["job_mib"]]  # measured, not declared
    assert held and 1400 <= held[0] <= 1600
    row = next(r for r in json.loads(get(f"{base}/api/jobs", token)) if r["id"] == job)
    assert row["mem_mib"] == 2048 and 1400 <= row["used_mib"] <= 1600  # needs, holds now

    done = d.wait_state(job, "done", timeout=30)
    s = done["summary"]
    assert s is not None and s["energy_wh"] > 0 and s["gpu_hours"] > 0
    assert 1400 <= s["peak_mib"] <= 1600 and s["mean_sm"] > 0
    store = MonitorStore(monitor_db_path(d.state_dir))
    try:
        logged = [(m["key"], m["step"], m["value"]) for m in store.metrics(job)]
    finally:
        store.close()
    assert logged == [("loss", i, 1.0 / (i + 1)) for i in range(5)]
    detail = json.loads(get(f"{base}/api/jobs/{job}", token))
    assert detail["summary"]["energy_wh"] > 0 and [m["key"] for m in detail["metrics"]] == ["loss"] * 5
    assert json.loads(get(f"{base}/api/status", token))["tracking"][0]["sink"] == "store"

    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir)}
    cli = [sys.executable, "-m", "collocate.daemon"]
    shown = subprocess.run([*cli, "show", job], env=env, capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "measured" in shown and "energy" in shown and "GPU-hours" in shown
    gpus_json = json.loads(subprocess.run([*cli, "gpus", "--format", "json"], env=env,
                                          capture_output=True, text=True, timeout=60,
                                          check=True).stdout)
    assert gpus_json["tracking_degraded"] is False
    assert {t["sink"] for t in gpus_json["tracking"]} == {"store", "prometheus"}
    assert len(gpus_json["gpus"]) == 2


def test_mlflow_records_one_run_per_job(daemons):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    d = daemons("--mlflow")
    jobs = [d.submit(metric_job(800, 0.5), mem="1GiB", name=f"m{i}") for i in range(2)]
    for job in jobs:
        d.wait_state(job, "done", timeout=30)
    d.kill(signal.SIGTERM)  # the sink flushes on close
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(d.state_dir).absolute() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("collocate")
    runs = client.search_runs([experiment.experiment_id])
    by_job = {r.data.tags["collocate.job_id"]: r for r in runs}
    assert sorted(by_job) == sorted(jobs)  # one run per job, none twice
    for run in by_job.values():
        assert run.info.status == "FINISHED"
        assert run.data.params["policy"] == "auto" and run.data.params["gpus"]
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [(m.step, m.value) for m in history] == [(i, 1.0 / (i + 1)) for i in range(5)]


def test_dashboard_keeps_one_random_token_only_the_owner_can_read(daemons):
    port = free_port()
    d = daemons("--dashboard", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}/"
    token_file = d.state_dir / "dashboard.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32
    url = cli(d, "dashboard-url")
    assert url.returncode == 0, url.stderr
    assert url.stdout.strip() == f"{base}?token={token}"
    assert f"dashboard on {base}?token={token}" in d.read_log()  # printed once at start
    assert token not in (d.state_dir / "daemon.log").read_text()  # never logged
    for path in ("", "api/jobs", "api/gpus", "metrics"):
        assert status_of(base + path) == 401, path
        assert status_of(base + path, "not-the-token-0123456789") == 401, path
        assert status_of(base + path, token) == 200, path
    assert status_of(f"{base}api/jobs?token={token}") == 200
    d.kill(signal.SIGTERM)
    d.start()  # the same token after a restart: bookmarks and scrape configs keep working
    assert token_file.read_text().strip() == token
    assert status_of(base + "api/jobs", token) == 200

    d.kill(signal.SIGTERM)
    token_file.chmod(0o644)  # widened by hand: refused rather than served
    refused = subprocess.run([sys.executable, "-m", "collocate.daemon", "serve", *d.args,
                              "--state-dir", str(d.state_dir)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode != 0 and "chmod 600" in refused.stderr
    token_file.unlink()  # deleting it is how to get a new one
    d.start()
    fresh = token_file.read_text().strip()
    assert fresh != token and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert status_of(base + "api/jobs", token) == 401 and status_of(base + "api/jobs", fresh) == 200


def test_no_dashboard_token_is_an_explicit_opt_out(daemons):
    port = free_port()
    d = daemons("--dashboard", f"127.0.0.1:{port}", "--no-dashboard-token")
    base = f"http://127.0.0.1:{port}/"
    assert status_of(base + "api/jobs") == 200
    assert not (d.state_dir / "dashboard.token").exists()
    assert cli(d, "dashboard-url").stdout.strip() == base
    plain = daemons(name="plain")
    no_dashboard = cli(plain, "dashboard-url")
    assert no_dashboard.returncode == 2 and "serves no dashboard" in no_dashboard.stderr
