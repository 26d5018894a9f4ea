"""CPU jobs (``--gpus 0``) through the same queue as GPU jobs, with real processes on emulated
GPUs: a pipeline prepare → train → evaluate with ``--after``, each step seeing the devices it
should (none for the CPU steps, its GPU for the training step, no MPS variables where there is
no GPU), and a CPU job that starts at once while every GPU is taken."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from daemon_harness import job_argv, wait_for


def env_probe(out: Path, seconds: float = 0.3) -> list[str]:
    """A job that writes what it sees of CUDA's variables to ``out``, then works a little."""
    code = ("import json, os, sys, time; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith('CUDA_')}, open(sys.argv[1], 'w')); time.sleep(float(sys.argv[2]))")
    return [sys.executable, "-c", code, str(out), str(seconds)]


def test_a_pipeline_runs_through_one_queue_and_each_step_sees_its_devices(daemons, tmp_path):
    d = daemons("--sharing", "mps", gpus="emulated:1xA100-40GB")
    prep = d.submit(env_probe(tmp_path / "prep.json"), gpus=0, name="prepare")
    train = d.submit(env_probe(tmp_path / "train.json"), gpus=1, mem="1GiB", after=[prep], name="train")
    evaluate = d.submit(env_probe(tmp_path / "eval.json"), gpus=0, after=[train], name="evaluate")
    for job_id in (prep, train, evaluate):
        assert d.wait_state(job_id, ("done", "failed", "cancelled"), timeout=60)["state"] == "done", \
            d.job(job_id)
    seen = {step: json.loads((tmp_path / f"{step}.json").read_text()) for step in ("prep", "train", "eval")}
    gpu_uuid = d.job(train)["attempts"][0]["uuids"][0]
    assert seen["train"]["CUDA_VISIBLE_DEVICES"] == gpu_uuid
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in seen["train"]  # MPS limits for a job on a GPU
    for step in ("prep", "eval"):
        assert seen[step]["CUDA_VISIBLE_DEVICES"] == "", seen[step]  # CUDA sees no device
        assert not [k for k in seen[step] if k.startswith("CUDA_MPS")], seen[step]
    shown = d.job(prep)
    assert shown["gpus"] == 0 and shown["attempts"][0]["gpus"] == [] and shown["attempts"][0]["host"]
    # ordered by their dependencies: each step started after the one before it ended
    a = {j: d.job(j)["attempts"][0] for j in (prep, train, evaluate)}
    assert a[prep]["end"] <= a[train]["start"] and a[train]["end"] <= a[evaluate]["start"]


def test_a_cpu_job_starts_at_once_while_the_gpus_are_full(daemons, tmp_path):
    d = daemons("--policy", "exclusive", gpus="emulated:1xA100-40GB")
    blocker = d.submit(job_argv(1000, 30), mem="2GiB", name="blocker")
    d.wait_state(blocker, "running", timeout=30)
    waiting = d.submit(job_argv(1000, 1), mem="2GiB", name="waits-for-the-gpu")
    submitted = time.time()
    cpu = d.submit(env_probe(tmp_path / "cpu.json", 0.2), gpus=0, name="cpu-now")
    shown = d.wait_state(cpu, ("running", "done"), timeout=10)
    started = shown["attempts"][0]["start"]
    assert started - submitted < 3.0, started - submitted  # a round or two, not the blocker's 30 s
    assert d.job(waiting)["state"] == "pending" and d.job(blocker)["state"] == "running"
    d.wait_state(cpu, "done", timeout=20)
    row = next(r for r in d.client.request("ls", all=True, ids=[cpu]) if r["id"] == cpu)
    assert row["gpus"] == 0 and row["on"] == []
    d.client.request("cancel", id=blocker)
    wait_for(lambda: d.job(waiting)["state"] == "done", 30, "the GPU job to run after the blocker")


def test_the_cpu_cap_holds_a_users_next_cpu_job_and_limits_shows_it(daemons):
    d = daemons(gpus="emulated:1xA100-40GB")
    shown = d.client.request("limits")
    assert shown["cpu_jobs_default"] == os.cpu_count() and shown["default"]["max_cpu_jobs"] is None
    d.client.request("set_limits", max_cpu_jobs=1)
    first = d.submit(["sleep", "30"], gpus=0)
    second = d.submit(["sleep", "0.1"], gpus=0)
    d.wait_state(first, "running", timeout=10)
    time.sleep(1.0)  # a few rounds (period 0.1 s): the cap keeps the second waiting
    waiting = d.job(second)
    assert waiting["state"] == "pending" and "max_cpu_jobs 1" in waiting["reason"], (waiting, d.job(first))
    assert [u["running_cpu_jobs"] for u in d.client.request("limits")["usage"].values()] == [1]
    d.client.request("cancel", id=first)  # its slot frees: the next one starts
    d.wait_state(second, "done", timeout=20)


def test_a_submission_is_placed_at_once_not_at_the_next_period(daemons, tmp_path):
    # a submission makes a round due at once (``service.WAKE_OPS``): with a 30 s period a job
    # used to wait for the next tick, up to the whole period (issue 35: a short job's
    # completion time carried up to a period of waiting)
    d = daemons("--period", "30", gpus="emulated:1xA100-40GB")
    time.sleep(1.0)  # the start-up round is over: the next tick is ~29 s away
    for gpus, mem in ((1, "1GiB"), (0, None)):
        submitted = time.time()
        job = d.submit(env_probe(tmp_path / f"now-{gpus}.json", 0.2), gpus=gpus, mem=mem, name=f"now-{gpus}")
        shown = d.wait_state(job, ("running", "done"), timeout=15)
        assert shown["attempts"][0]["start"] - submitted < 5.0, shown
