"""A lab's day on one shared root daemon, with real member users (``lab_harness``): fair share
between members, per-user caps, time limits, holds, Slurm's ``afterany``/``afternotok``, a
command run when a job ends, and members' jobs on emulated GPUs (a lab's rehearsal)."""

from __future__ import annotations

import shutil
import time

import pytest
from daemon_harness import wait_for
from lab_harness import emulated_job, lab_daemon, lab_members, stop_lab, why_no_lab, work_dir

pytestmark = pytest.mark.skipif(why_no_lab() is not None, reason=str(why_no_lab()))


@pytest.fixture
def lab():
    members = lab_members()
    work = work_dir()
    started = []

    def make(*args: str, gpus: str = "emulated:2xA100-40GB"):
        started.append(lab_daemon(*args, gpus=gpus))
        return started[-1]

    try:
        yield make, members, work
    finally:
        for d in started:
            stop_lab(d)
        shutil.rmtree(work, ignore_errors=True)


def run_ok(member, d, *args, work):
    out = member.run(d.state_dir, *args, cwd=str(work))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def submit_all(member, d, work, *jobs):
    """Submit several jobs as ``member`` in one process (the CLI costs a second each here):
    each job is (argv, options)."""
    answers = member.requests(d.state_dir, *(("submit", {"argv": argv, "cwd": str(work), "mem": "1GiB",
                                                         "base_env": member.env(), **opts})
                                             for argv, opts in jobs))
    assert all(a["ok"] for a in answers), answers
    return [a["result"]["id"] for a in answers]


def test_fair_share_runs_another_members_first_job_before_a_flood(lab):
    make, (alice, bob, _), work = lab
    d = make("--policy", "exclusive", gpus="emulated:1xA100-40GB")
    d.client.request("drain")
    flood = submit_all(alice, d, work, *[(["/bin/sleep", "1.5"], {})] * 3)
    d.client.request("resume")
    wait_for(lambda: d.job(flood[0])["state"] == "running", 30, "the flood's first job")
    late, = submit_all(bob, d, work, (["/bin/sleep", "1.5"], {}))
    position = wait_for(lambda: {r["id"]: r["position"] for r in d.client.request("ls")}, 5, "ls")
    assert position[late] == 1, position  # next in the queue, ahead of the flood
    ids = [*flood, late]
    for job in ids:
        d.wait_state(job, "done", timeout=60)
    starts = sorted(ids, key=lambda j: d.job(j)["attempts"][0]["start"])
    assert starts.index(late) == 1, starts  # right after the job that ran when it came


def test_caps_keep_one_member_within_what_the_owner_allows(lab):
    make, (alice, bob, _), work = lab
    d = make()
    refused = alice.run(d.state_dir, "limits", "--max-jobs", "9")
    assert refused.returncode == 2 and "only the daemon's owner" in refused.stderr
    d.client.request("set_limits", max_jobs=1, max_gpus=None)
    mine = submit_all(alice, d, work, *[(["/bin/sleep", "30"], {})] * 2)
    d.wait_state(mine[0], "running")
    theirs, = submit_all(bob, d, work, (["/bin/sleep", "30"], {}))
    d.wait_state(theirs, "running")  # bob's job takes the room alice may not
    second = wait_for(lambda: (j := d.job(mine[1]))["state"] == "pending" and j["wait"] == "limit" and j,
                      10, "the cap as the reason")
    assert "collocate-m1 runs 1 job(s)" in second["reason"]
    shown = bob.run(d.state_dir, "limits")
    assert shown.returncode == 0 and "at most 1 running jobs" in shown.stdout
    alice.request(d.state_dir, "cancel", id=mine[0])
    d.wait_state(mine[1], "running")


def test_time_limits_and_the_dependencies_slurm_users_write(lab):
    make, (alice, _, _), work = lab
    d = make()
    slow = run_ok(alice, d, "submit", "--hold", "--mem", "1GiB", "--time", "2s", "--", "/bin/sleep", "60",
                  work=work)
    if_ok, if_not, anyway = submit_all(alice, d, work, (["/bin/true"], {"after": [slow]}),
                                       (["/bin/true"], {"after_notok": [slow]}),
                                       (["/bin/true"], {"after_any": [slow]}))
    assert d.job(anyway)["wait"] == "dependency"
    alice.request(d.state_dir, "release", id=slow)
    ended = d.wait_state(slow, "timeout", timeout=30)
    assert ended["reason"] == "reached its time limit of 0:02 (--time); stopped"
    assert ended["attempts"][-1]["outcome"] == "timeout"
    assert d.wait_state(if_ok, "cancelled")["reason"] == f"job {slow} it depends on ended timeout"
    d.wait_state(if_not, "done")
    d.wait_state(anyway, "done")
    listed = alice.run(d.state_dir, "ls", "--all")
    row = next(line for line in listed.stdout.splitlines() if line.startswith(f"{slow} "))
    assert "timeout" in row and "/0:02" in row  # TIME shows the run against its limit


def test_hold_and_release_a_members_own_job(lab):
    make, (alice, bob, _), work = lab
    d = make()
    job = run_ok(alice, d, "submit", "--hold", "--mem", "1GiB", "--", "/bin/true", work=work)
    time.sleep(1.0)
    held = d.job(job)
    assert held["state"] == "pending" and held["wait"] == "held" and "collocate release" in held["reason"]
    theirs = bob.run(d.state_dir, "release", job)
    assert theirs.returncode == 1 and "belongs to collocate-m1" in theirs.stderr
    assert run_ok(alice, d, "release", job, work=work) == f"{job}: released"
    d.wait_state(job, "done")
    again = alice.run(d.state_dir, "hold", job)
    assert again.returncode == 1 and "only a pending job can be held" in again.stderr


def test_notify_runs_as_the_member_when_the_job_ends(lab):
    make, (alice, _, _), work = lab
    d = make()
    note = work / "notified"
    command = f"sh -c 'id -u >> {note}; echo $COLLOCATE_JOB_STATE >> {note}; cat >> {note}'"
    job = run_ok(alice, d, "submit", "--notify", command, "--mem", "1GiB", "--", "/bin/sh", "-c", "exit 5",
                 work=work)
    d.wait_state(job, "failed")
    text = wait_for(lambda: note.exists() and len(note.read_text().splitlines()) >= 3 and note.read_text(),
                    20, "the notify command's output")
    uid, state, summary = text.splitlines()[:3]
    assert (uid, state) == (str(alice.uid), "failed")
    assert summary == f"collocate job {job} (exit) failed: exited with status 5"  # `sh -c "exit 5"`: its first word


def test_members_jobs_run_on_the_daemons_emulated_gpus(lab):
    make, (alice, bob, _), work = lab
    d = make()
    jobs = [submit_all(m, d, work, (emulated_job(2048, 3), {"mem": "2GiB"}))[0] for m in (alice, bob)]
    wait_for(lambda: sum(g["used_mib"] or 0 for g in d.client.request("gpus")) >= 4096, 30,
             "both members' jobs holding emulated memory")
    for job in jobs:
        done = d.wait_state(job, ("done", "failed"), timeout=60)
        assert done["state"] == "done", (done, d.client.request("logs", id=job, stream="stderr"))
    table = bob.run(d.state_dir, "gpus")
    assert table.returncode == 0 and "COMMITTED" in table.stdout and "ROOM" in table.stdout
