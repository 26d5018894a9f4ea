"""Every row of the rights table (``collocate.wire.rights.RIGHTS``), exercised by real member
users of a root daemon: what a second member may and may not do to the first one's jobs, what
only the daemon's owner may do, and what members see of each other's jobs (``squeue``'s view:
no command, no logs, no stderr in reasons, unless the job's owner opted in with ``--public``).
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
from daemon_harness import wait_for
from lab_harness import lab_daemon, lab_members, sh, stop_lab, why_no_lab, work_dir

from collocate.wire.rights import RIGHTS

pytestmark = pytest.mark.skipif(why_no_lab() is not None, reason=str(why_no_lab()))

SECRET = "postgres://lab:hunter2-secret@db/exp"


@pytest.fixture(scope="module")
def lab():
    members = lab_members()
    work = work_dir()
    d = lab_daemon()
    try:
        yield d, members, work
    finally:
        stop_lab(d)
        shutil.rmtree(work, ignore_errors=True)


def submit(member, d, work, argv, **opts):
    args = {"argv": argv, "cwd": str(work), "mem": "1GiB",
            "base_env": {"PATH": "/usr/bin:/bin"}, **opts}
    return member.request(d.state_dir, "submit", **args)["id"]


def test_every_operation_has_a_rule_and_a_test_here():
    tested = {"ping", "gpus", "history", "limits", "submit", "ls", "show", "logs", "cancel", "hold",
              "release", "priority", "set_limits", "drain", "resume", "attach", "update", "suspend",
              "resume_job", "purge"}
    assert set(RIGHTS) == tested  # a new operation needs its rule tested below


def test_a_second_member_cannot_touch_the_first_ones_jobs(lab):
    d, (alice, bob, _), work = lab
    d.client.request("drain")  # nothing starts: the jobs stay pending for the duration
    try:
        job = submit(alice, d, work, sh("sleep 30"))
        answers = bob.requests(d.state_dir, ("cancel", {"id": job}), ("hold", {"id": job}),
                               ("priority", {"id": job, "priority": -5}),
                               ("logs", {"id": job}), ("release", {"id": job}))
        for answer in answers:
            assert not answer["ok"] and "belongs to collocate-m1" in answer["error"], answers
        # her own, all of them
        mine = alice.requests(d.state_dir, ("hold", {"id": job}), ("release", {"id": job}),
                              ("priority", {"id": job, "priority": -5}),
                              ("priority", {"id": job, "priority": 3}), ("logs", {"id": job}),
                              ("cancel", {"id": job}))
        assert [a["ok"] for a in mine] == [True, True, True, False, True, True], mine
        assert "only the daemon's owner may raise" in mine[3]["error"]
        assert d.job(job)["state"] == "cancelled" and d.job(job)["priority"] == -5
    finally:
        d.client.request("resume")


def test_purge_is_the_owners_and_takes_ended_jobs_only(lab):
    """``collocate purge``: cancel's rule. Another member is refused (and ``before`` takes only
    the asker's own jobs); the owner removes an ended job's logs; the daemon's owner any."""
    d, (alice, bob, _), work = lab
    hers = submit(alice, d, work, sh("echo kept-until-purged"))
    d.wait_state(hers, "done", timeout=60)
    theirs, before = bob.requests(d.state_dir, ("purge", {"id": hers}), ("purge", {"before": time.time() + 60}))
    assert not theirs["ok"] and "belongs to collocate-m1" in theirs["error"], theirs
    assert before["ok"] and hers not in before["result"]["purged"], before
    assert alice.request(d.state_dir, "logs", id=hers)["text"] == "kept-until-purged\n"
    assert alice.request(d.state_dir, "purge", id=hers)["freed"] == len("kept-until-purged\n")
    assert alice.request(d.state_dir, "logs", id=hers)["text"] == ""
    assert d.job(hers)["state"] == "done"  # the record stays
    his = submit(bob, d, work, sh("echo his"))
    d.wait_state(his, "done", timeout=60)
    assert d.client.request("purge", id=his)["freed"] == len("his\n")  # the daemon's owner


def test_only_the_owner_attaches_to_an_interactive_job(lab):
    """``collocate run``'s terminal: another member is refused before anything is relayed
    (the relay itself: ``test_e2e_run.py``)."""
    d, (alice, bob, _), work = lab
    d.client.request("drain")
    try:
        job = submit(alice, d, work, ["/bin/sh"], interactive=True)
        refused = bob.requests(d.state_dir, ("attach", {"id": job}))[0]
        assert not refused["ok"] and "may not attach to job" in refused["error"], refused
        assert "belongs to collocate-m1" in refused["error"]
        mine = alice.requests(d.state_dir, ("attach", {"id": job}))[0]
        assert mine["ok"] and mine["result"] == {"state": "pending"}, mine
        batch = submit(alice, d, work, ["/bin/true"])
        no_terminal = alice.requests(d.state_dir, ("attach", {"id": batch}))[0]
        assert not no_terminal["ok"] and "not interactive" in no_terminal["error"]
        alice.requests(d.state_dir, ("cancel", {"id": job}), ("cancel", {"id": batch}))
    finally:
        d.client.request("resume")


def test_a_running_job_is_its_owners_to_suspend_and_resume(lab):
    d, (alice, bob, _), work = lab
    job = submit(alice, d, work, sh("sleep 60"))
    try:
        wait_for(lambda: d.job(job)["state"] == "running" and d.job(job)["attempts"][-1]["dir"], 30,
                 "alice's job to run")
        wait_for(lambda: alice.requests(d.state_dir, ("suspend", {"id": job}))[0]["ok"], 10,
                 "alice's job to be suspended by her")  # once its processes run
        refused = bob.requests(d.state_dir, ("resume_job", {"id": job}), ("suspend", {"id": job}))
        assert all(not a["ok"] and "belongs to collocate-m1" in a["error"] for a in refused), refused
        shown = d.job(job)
        assert shown["suspended"] == "user" and shown["state"] == "running"
        assert alice.requests(d.state_dir, ("resume_job", {"id": job}))[0]["ok"]
        assert not d.job(job)["suspended"]
    finally:
        d.client.request("cancel", id=job)


def test_priority_is_the_owners_to_raise_and_members_may_lower_their_own(lab):
    d, (alice, _, _), work = lab
    up = alice.requests(d.state_dir, ("submit", {"argv": ["/bin/true"], "cwd": str(work),
                                                 "mem": "1GiB", "priority": "99999999999999999999999"}),
                        ("submit", {"argv": ["/bin/true"], "cwd": str(work), "mem": "1GiB", "priority": -99999999}),
                        ("submit", {"argv": ["/bin/true"], "cwd": str(work), "mem": "1GiB", "priority": 5}))
    assert not up[0]["ok"] and "whole number" in up[0]["error"] and "at most 18" in up[0]["error"] + up[0].get("hint", "")
    assert not up[1]["ok"] and "at least -1000000" in up[1]["error"]
    assert not up[2]["ok"] and "only the daemon's owner may raise" in up[2]["error"]
    nice = alice.run(d.state_dir, "submit", "--nice", "10", "--mem", "1GiB", "--", "/bin/true", cwd=str(work))
    assert nice.returncode == 0, nice.stderr
    assert d.job(nice.stdout.strip())["priority"] == -10
    boosted = d.client.request("submit", argv=["/bin/true"], cwd=str(work), mem="1GiB", priority=50)
    assert d.job(boosted["id"])["priority"] == 50  # root, the daemon's owner


def test_update_is_the_owners_with_prioritys_rule(lab):
    d, (alice, bob, _), work = lab
    d.client.request("drain")
    try:
        job = submit(alice, d, work, sh("sleep 30"))
        theirs = bob.requests(d.state_dir, ("update", {"id": job, "name": "bobs"}))[0]
        assert not theirs["ok"] and "belongs to collocate-m1" in theirs["error"]
        mine = alice.requests(d.state_dir, ("update", {"id": job, "name": "renamed", "mem": "2GiB",
                                                       "priority": -3}),
                              ("update", {"id": job, "priority": 4}))
        assert mine[0]["ok"] and not mine[1]["ok"], mine
        assert "only the daemon's owner may raise" in mine[1]["error"]
        shown = d.job(job)
        assert (shown["name"], shown["mem_mib"], shown["priority"]) == ("renamed", 2048.0, -3)
        assert d.client.request("update", id=job, priority=7)["priority"] == 7  # root may raise
        alice.request(d.state_dir, "cancel", id=job)
    finally:
        d.client.request("resume")


def test_admin_operations_are_the_daemon_owners(lab):
    d, (alice, _, _), _ = lab
    answers = alice.requests(d.state_dir, ("drain", {}), ("resume", {}),
                             ("set_limits", {"max_gpus": 1}), ("limits", {}), ("ping", {}),
                             ("gpus", {}), ("history", {"since_s": 3600}))
    assert [a["ok"] for a in answers] == [False, False, False, True, True, True, True], answers
    assert all("only the daemon's owner" in a["error"] for a in answers[:3])
    assert not d.client.request("ping")["draining"]
    cli = alice.run(d.state_dir, "drain")
    assert cli.returncode == 2 and "only the daemon's owner may drain" in cli.stderr
    assert "Traceback" not in cli.stderr


def test_an_admin_hold_is_released_by_the_admin_only(lab):
    d, (alice, _, _), work = lab
    d.client.request("drain")
    try:
        job = submit(alice, d, work, sh("sleep 30"))
        assert d.client.request("hold", id=job)["held"] == "admin"
        refused = alice.requests(d.state_dir, ("release", {"id": job}))[0]
        assert not refused["ok"] and "only they may release it" in refused["error"]
        assert d.client.request("release", id=job)["held"] == ""
        alice.request(d.state_dir, "cancel", id=job)
    finally:
        d.client.request("resume")


def test_others_see_what_squeue_shows_and_stderr_never(lab):
    d, (alice, bob, _), work = lab
    failing = submit(alice, d, work, sh(f"echo 'connecting to {SECRET}' >&2; exit 3"))
    shared = submit(alice, d, work, sh("echo shared-output"), public=True)
    d.wait_state(failing, "failed")
    d.wait_state(shared, "done")
    theirs = bob.requests(d.state_dir, ("ls", {"all": True}), ("show", {"id": failing}),
                          ("logs", {"id": failing, "stream": "stderr"}), ("show", {"id": shared}),
                          ("logs", {"id": shared}))
    seen = json.dumps(theirs[:2])
    assert "hunter2" not in seen and "connecting to" not in seen
    row = next(r for r in theirs[0]["result"] if r["id"] == failing)
    assert row["reason"] == "exited with status 3" and row["user"] == "collocate-m1"
    assert row["exit_code"] == 3 and row["on"]  # sacct's view: exit code and GPUs of an ended job
    detail = theirs[1]["result"]
    assert "argv" not in detail and "cwd" not in detail and detail["redacted"]
    assert not theirs[2]["ok"] and "belongs to collocate-m1" in theirs[2]["error"]
    assert theirs[3]["result"]["argv"] == ["/bin/sh", "-c", "echo shared-output"]  # --public
    assert theirs[4]["result"]["text"] == "shared-output\n"
    own = alice.request(d.state_dir, "show", id=failing)
    assert "hunter2" in own["reason"] and own["argv"][0] == "/bin/sh"
    table = bob.run(d.state_dir, "show", failing)
    assert table.returncode == 0 and "only its owner sees it" in table.stdout
    assert "hunter2" not in table.stdout


def test_dashboard_url_sends_a_member_to_their_own_dashboard():
    members = lab_members()
    d = lab_daemon("--dashboard", "0", gpus="emulated:1xA100-40GB", period=0.2)
    try:
        wait_for(lambda: d.client.request("ping")["dashboard"], 10, "the dashboard")
        out = members[0].run(d.state_dir, "dashboard-url")
        assert out.returncode == 2 and "collocate dashboard --port" in out.stderr
        assert "ask the owner" not in out.stderr
    finally:
        stop_lab(d)
