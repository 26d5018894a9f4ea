"""`ClientSource` (the dashboard over the daemon's socket API) against a real daemon process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from collocate.client.connect import Client
from collocate.web.client_source import ClientSource


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def daemon(tmp_path: Path):
    state = tmp_path / "state"
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "collocate.cli", "serve", "--state-dir",
                             str(state), "--gpus", "emulated:2xA100-40GB", "--period", "0.2"],
                            stdout=log, stderr=subprocess.STDOUT)
    client = Client(state, timeout_s=30)
    try:
        wait_for(lambda: client.request("ping"), 60, "the daemon to answer")
        yield client
    finally:
        jobs = []
        try:
            jobs = client.request("ls", all=True)
        except Exception:
            pass
        for job in jobs:
            if job["state"] in ("pending", "running"):
                try:
                    client.request("cancel", id=job["id"])
                except Exception:
                    pass
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_client_source_shows_the_daemon_gpus_jobs_and_logs(daemon, tmp_path):
    source = ClientSource(daemon, allow_submit=True, cwd=tmp_path)
    gpus = source.gpus()
    assert [g["type"] for g in gpus] == ["A100-40GB", "A100-40GB"]
    job_id = source.submit([sys.executable, "-m", "collocate.cli", "emulate-job", "--mem",
                            "2GiB", "--seconds", "30", "--ramp", "0"], name="web", mem="3GiB")
    running = wait_for(lambda: [j for j in source.jobs()
                                if j["id"] == job_id and j["state"] == "running"],
                       60, "the job to run")
    assert running[0]["name"] == "web"
    wait_for(lambda: any(job_id in g["jobs"] and (g["used_mib"] or 0) >= 2048
                         for g in source.gpus()), 60, "the job's memory on a GPU")
    detail = source.job(job_id)
    assert detail is not None and detail["argv"][-1] == "0" and source.job("999") is None
    text = wait_for(lambda: source.log_tail(job_id, 4096), 60, "the job's output")
    assert "emulated job pid" in text
    assert source.log_tail(job_id, 10) == text[-10:]
    assert "daemon" in source.status()
    assert not hasattr(ClientSource(daemon), "submit")  # read-only unless asked


@pytest.mark.slow
def test_dashboard_command_serves_a_running_daemon_behind_a_stable_token(daemon):
    import httpx

    def start(*extra):
        proc = subprocess.Popen([sys.executable, "-m", "collocate.cli", "dashboard", "--state-dir",
                                 str(daemon.state_dir), "--port", "0", *extra],
                                stderr=subprocess.PIPE, text=True)
        line = proc.stderr.readline()
        assert line.startswith("dashboard on http://127.0.0.1:"), line
        return proc, line.split()[2]

    proc, link = start()
    try:
        url, token = link.split("?token=")
        assert len(token) >= 32
        assert httpx.get(url + "api/gpus", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        gpus = httpx.get(url + "api/gpus", headers=auth, timeout=10).json()
        assert len(gpus) == 2 and gpus[0]["type"] == "A100-40GB"
        assert httpx.get(link, timeout=10).text.startswith("<!doctype html>")
        assert httpx.post(url + "api/jobs", json={"argv": ["true"]}, headers=auth, timeout=10).status_code == 501
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    token_file = daemon.state_dir / "dashboard.token"  # the state dir's owner: its kept token
    assert token_file.read_text().strip() == token and token_file.stat().st_mode & 0o777 == 0o600
    proc, again = start()
    try:
        assert again.split("?token=")[1] == token  # the same token after a restart
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    proc, url = start("--no-token")
    try:
        assert httpx.get(url + "api/gpus", timeout=10).status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    refused = subprocess.run([sys.executable, "-m", "collocate.cli", "dashboard", "--state-dir",
                              str(daemon.state_dir), "--host", "0.0.0.0", "--no-token"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "cannot go without a token" in refused.stderr
