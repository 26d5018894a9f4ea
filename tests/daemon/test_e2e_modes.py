"""Sharing modes, MIG instances, following logs, and the demo, on emulated GPUs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from daemon_harness import job_argv

from collocate.common.errors import CollocateError

ENV_DUMP = [sys.executable, "-c",
            ("import os; [print(k + '=' + os.environ.get(k, '')) for k in ('CUDA_VISIBLE_DEVICES', "
            "'COLLOCATE_SHARING', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', "
            "'COLLOCATE_JOB_ID', 'MY_VAR')]")]


def test_mps_jobs_get_limits_from_their_estimate(daemons):
    d = daemons("--sharing", "mps")
    job = d.submit(ENV_DUMP, mem="6GiB", env=["MY_VAR=hello"])
    d.wait_state(job, "done")
    env = dict(line.split("=", 1) for line in d.client.request("logs", id=job)["text"].splitlines())
    assert env["COLLOCATE_SHARING"] == "mps" and env["MY_VAR"] == "hello" and env["COLLOCATE_JOB_ID"] == job
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-emu-")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == ""  # no thread cap: no policy sets one
    # 6144 MiB declared, x 1.15 (an unmeasured requirement's least slack) + the 512 MiB margin
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7578M"


def test_mig_instances_are_scheduled_as_gpus_of_their_own_size(daemons):
    d = daemons(gpus="emulated:1xA100-40GB:mig0=3g.20gb,4g.20gb")
    gpus = d.client.request("gpus")
    assert len(gpus) == 2 and all(g["uuid"].startswith("MIG-emu-") for g in gpus)
    with pytest.raises(CollocateError, match="largest MIG instance has"):
        d.submit(job_argv(1000, 0.2), mem="30GiB")  # fits an A100-40GB, not a 20 GB instance
    job = d.submit(job_argv(5000, 0.5), mem="6GiB")
    done = d.wait_state(job, "done")
    assert done["attempts"][0]["uuids"][0].startswith("MIG-emu-")
    assert 4900 <= done["attempts"][0]["peak_mib"] <= 5100


def test_a_multi_gpu_job_is_never_spread_over_mig_instances(daemons):
    """GPU 0 split into two instances, GPU 1 whole: two devices are free, but a 2-GPU job
    cannot run on an instance (the core's admission rule, as in the simulator)."""
    d = daemons(gpus="emulated:2xA100-40GB:mig0=3g.20gb,4g.20gb")
    assert len(d.client.request("gpus")) == 3
    with pytest.raises(CollocateError, match="NCCL does not run across MIG instances"):
        d.submit(job_argv(1000, 0.2), mem="4GiB", gpus=2)
    job = d.submit(job_argv(1000, 0.3), mem="4GiB")
    assert d.wait_state(job, "done")["attempts"][0]["uuids"][0].startswith(("MIG-emu-", "GPU-emu-"))


def test_a_multi_gpu_job_takes_whole_gpus_beside_mig_instances(daemons):
    """GPU 0 split, GPUs 1 and 2 whole: the instances come first in the device list, but a
    2-GPU job runs on the two whole GPUs."""
    d = daemons(gpus="emulated:3xA100-40GB:mig0=3g.20gb,4g.20gb")
    job = d.submit(job_argv(1000, 0.3), mem="4GiB", gpus=2)
    uuids = d.wait_state(job, "done")["attempts"][0]["uuids"]
    assert len(uuids) == 2 and all(u.startswith("GPU-emu-") for u in uuids)


def test_logs_follow_until_the_job_ends(daemons, tmp_path):
    d = daemons()
    job = d.submit(job_argv(500, 1.5), mem="1GiB")
    d.wait_state(job, "running")
    out = subprocess.run([sys.executable, "-m", "collocate.cli", "logs", job, "-f", "--state-dir",
                          str(d.state_dir)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "done in" in out.stdout


def test_demo_runs_and_prints_the_comparison():
    """As ``--format json``: the numbers themselves (the table's layout is test_cli_text's)."""
    out = subprocess.run([sys.executable, "-m", "collocate.cli", "demo", "--scale", "0.15", "--timeout", "120",
                          "--format", "json"], capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert [r["policy"] for r in result] == ["exclusive", "auto"]
    for r in result:  # every job done under both policies
        assert r["finished"] and r["done"] == 16 and r["failed"] == 0 and r["makespan"] > 0, r


def test_submit_estimate_uses_the_static_estimator_then_history_wins(daemons, tmp_path):
    d = daemons()
    cmd = [sys.executable, "-m", "collocate.cli", "submit", "--state-dir", str(d.state_dir), "--cwd", str(tmp_path),
           "--env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
           "--estimate", "collocate.workloads.models:build_mlp", "--batch-size", "8", "--precision", "bf16",
           "--", *job_argv(700, 0.3)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=150, check=False)
    assert out.returncode == 0, out.stderr
    assert "expandable allocator" in out.stderr  # the job's own allocator setting was estimated
    assert "bf16" in out.stderr  # and the precision it trains in
    assert "A100-40GB" in out.stderr  # for the daemon's GPUs, none being named
    first = d.job(out.stdout.strip())
    assert first["mem_source"].startswith("static-") and first["mem_mib"] > 0
    direct = subprocess.run([sys.executable, "-m", "collocate.cli", "estimate", "collocate.workloads.models:build_mlp",
                             "-b", "8", "--precision", "bf16", "--allocator", "expandable", "--gpu", "A100-40GB",
                             "--format", "json"],
                            capture_output=True, text=True, timeout=150, check=True)
    assert first["mem_mib"] == pytest.approx(json.loads(direct.stdout)["mib"], abs=0.1)  # what `estimate` says
    d.wait_state(first["id"], "done")
    again = d.submit(job_argv(700, 0.3), cwd=str(tmp_path), mem="5GiB")
    assert d.job(again)["mem_source"] == "history"  # measured beats both static and declared


def test_estimate_options_without_estimate_are_refused(daemons, tmp_path):
    d = daemons()
    out = subprocess.run([sys.executable, "-m", "collocate.cli", "submit", "--state-dir", str(d.state_dir),
                          "--mem", "1GiB", "--precision", "bf16", "--", *job_argv(100, 0.1)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "--estimate" in out.stderr
    assert d.client.request("ls", all=True) == []  # nothing was queued
