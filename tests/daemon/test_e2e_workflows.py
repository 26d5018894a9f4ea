"""Queueing work the way a sweep or a pipeline does, through the real CLI and a real daemon:
`submit --sweep`, `submit --after`, and `collocate wait`."""

from __future__ import annotations

import subprocess
import sys

from daemon_harness import gated_argv, job_argv

CLI = [sys.executable, "-m", "collocate.cli"]


def cli(d, *args, timeout=60):
    return subprocess.run([*CLI, *args, "--state-dir", str(d.state_dir)], capture_output=True, text=True,
                          timeout=timeout, cwd=d.state_dir.parent)


def submit(d, *args):
    argv = [*CLI, "submit", "--state-dir", str(d.state_dir), "--cwd", str(d.state_dir.parent), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_sweep_queues_one_named_job_per_combination_and_wait_reports_them(daemons):
    d = daemons()
    out = submit(d, "--mem", "1GiB", "--sweep", "mem=600,800", "--sweep", "seconds=1..2",
                 "--", *job_argv(0, 0)[:2], "{mem}", "{seconds}", "-", "0.1")
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert len(ids) == 4
    names = sorted(d.job(i)["name"] for i in ids)
    assert names == ["job.py[mem=600,seconds=1]", "job.py[mem=600,seconds=2]",
                     "job.py[mem=800,seconds=1]", "job.py[mem=800,seconds=2]"]
    assert d.job(ids[3])["argv"][-4:] == ["800", "2", "-", "0.1"]
    waited = cli(d, "wait", *ids)
    assert waited.returncode == 0, waited.stderr
    assert sorted(waited.stdout.split("\n")[:-1]) == sorted(f"{i} done" for i in ids)


def test_a_bad_sweep_stores_nothing(daemons):
    d = daemons()
    out = submit(d, "--sweep", "lr=1,2", "--", "python", "train.py")
    assert out.returncode == 2 and "--sweep lr is not used in the command" in out.stderr
    assert d.client.request("ls", all=True) == []


def test_a_job_after_another_starts_only_once_it_is_done_and_is_cancelled_if_it_fails(daemons, tmp_path):
    d = daemons()  # 2 GPUs: the dependent job could start at once if it did not wait
    # the jobs depended on run until their gate opens: still running when the dependents are
    # submitted, however long a loaded machine takes to start the CLI
    first = d.submit(gated_argv(tmp_path / "first-may-end"), mem="1GiB")
    then = submit(d, "--mem", "1GiB", "--after", first, "--", *job_argv(500, 0.2)).stdout.strip()
    assert d.job(then)["reason"] == f"dependency: waits for job {first}"
    shown = cli(d, "show", then)
    assert f"after job(s) {first}" in " ".join(shown.stdout.split())  # show's fields: name, value beside
    (tmp_path / "first-may-end").touch()
    done = d.wait_state(then, "done", timeout=60)
    assert done["attempts"][0]["start"] >= d.job(first)["attempts"][0]["end"] - 0.3
    # A failing dependency cancels its dependents, transitively; `wait` says so and exits 1.
    bad = d.submit(gated_argv(tmp_path / "bad-may-fail", exit_with="3"), mem="1GiB")
    child = submit(d, "--mem", "1GiB", "--after", bad, "--", *job_argv(500, 0.2)).stdout.strip()
    grandchild = submit(d, "--mem", "1GiB", "--after", child, "--", *job_argv(500, 0.2)).stdout.strip()
    (tmp_path / "bad-may-fail").touch()
    waited = cli(d, "wait", bad, child, grandchild)
    assert waited.returncode == 1
    assert f"{child} cancelled: job {bad} it depends on ended failed" in waited.stdout
    assert f"{grandchild} cancelled: job {child} it depends on ended cancelled" in waited.stdout


def test_after_an_unknown_or_failed_job_is_refused_at_submit(daemons):
    d = daemons()
    out = submit(d, "--after", "99", "--", *job_argv(100, 0.1))
    assert out.returncode == 2 and "depends on job 99, which does not exist" in out.stderr
    bad = d.submit([sys.executable, "-c", "raise SystemExit(1)"], mem="1GiB")
    d.wait_state(bad, "failed")
    out = submit(d, "--after", bad, "--", *job_argv(100, 0.1))
    assert out.returncode == 2 and f"depends on job {bad}, which ended failed" in out.stderr
    assert [r["id"] for r in d.client.request("ls", all=True)] == [bad]


def test_wait_gives_up_after_its_timeout_and_refuses_unknown_ids(daemons):
    d = daemons()
    slow = d.submit(job_argv(100, 30), mem="1GiB")
    out = cli(d, "wait", slow, "--timeout", "0.5")
    assert out.returncode == 124 and f"still not ended after 0.5 s: {slow}" in out.stderr
    out = cli(d, "wait", "42")
    assert out.returncode == 2 and "no job '42'" in out.stderr
    d.client.request("cancel", id=slow)
