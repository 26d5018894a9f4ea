"""Nothing one member does reaches another (issue 36, findings 1, 2, 3, 7, 8 and ``show``):
each reproduction of the issue replayed by real users (``lab.py``: members A and B of a root
daemon serving ``--group nogroup``) and found refused or harmless.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
from daemon_harness import Daemon, wait_for
from lab import cli_as, raw_requests, submit_as

SECRET = "hunter2-issue36"


def _sock(d: Daemon) -> Path:
    return d.state_dir / "collocate.sock"


def _ok(reply: dict) -> str:
    assert reply["ok"], reply
    return reply["result"]["id"]


def _root_cmdlines() -> list[str]:
    """Every root process's command line, as any local user reads it in /proc."""
    lines = []
    for p in psutil.process_iter(["cmdline", "uids"]):
        if p.info["uids"] is not None and p.info["uids"].real == 0 and p.info["cmdline"]:
            lines.append(" ".join(p.info["cmdline"]))
    return lines


# -- finding 7 and 8, and show: commands stay private ---------------------------------------------
def test_a_jobs_command_shows_in_no_root_process_name_or_others_show(lab, lab_daemon):
    """A's job carries a secret in its arguments and inline: no root process shows it (the
    runner reads the command from a 0600 file), its default name leaves ``NAME=VALUE`` out,
    and B's ``show`` gives what ``ls`` gives (no identity, runner pid or samples)."""
    d, work = lab_daemon()
    job = _ok(submit_as(lab["A"], _sock(d), cwd=str(work), argv=[
        "/bin/bash", "-c", f"TOKEN={SECRET} sleep 300", "x", f"--db-password={SECRET}"]))
    running = d.wait_state(job, "running", timeout=60)
    wait_for(lambda: any(p.username() == "collocate-a" for p in _job_processes(running)),
             30, "the job's own process")
    assert not [c for c in _root_cmdlines() if SECRET in c]
    rows, shown = (r["result"] for r in raw_requests(lab["B"], _sock(d), [
        json.dumps({"op": "ls", "args": {}}).encode(),
        json.dumps({"op": "show", "args": {"id": job}}).encode()]))
    row = next(r for r in rows if r["id"] == job)
    assert row["name"] == "sleep" and SECRET not in json.dumps(rows)
    assert shown["redacted"] and SECRET not in json.dumps(shown)
    for private in ("identity", "summary", "profile", "argv", "cwd"):
        assert private not in shown
    assert all("pid" not in a and "runners" not in a for a in shown["attempts"])
    assert set(shown) - {"attempts", "redacted", "max_retries", "attempts_used", "after",
                         "after_any", "after_notok", "retry_failures", "sweep", "sweep_max"} <= set(row)
    table = cli_as(lab["B"], d.state_dir, "show", job)
    assert table.returncode == 0, table.stderr
    assert "only its owner sees it" in table.stdout and SECRET not in table.stdout
    own = cli_as(lab["A"], d.state_dir, "show", job)
    assert SECRET in own.stdout  # the owner sees their own command


def _job_processes(detail: dict) -> list[psutil.Process]:
    pid = detail["attempts"][-1]["pid"] if detail.get("attempts") else None
    try:
        return psutil.Process(pid).children(recursive=True) if pid else []
    except psutil.Error:
        return []


# -- finding 1 and 2: --notify is a part of the job, confined, capped, readable ------------------
def _sleepers(seconds: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", seconds]]


def test_notify_runs_confined_as_the_member_and_its_output_is_capped(lab, lab_daemon):
    """The issue's reproductions: ``--notify "sh -c 'sleep 4444 &'"`` leaves nothing running
    (its cgroup is stopped with it), a notify writing 20 MB keeps ``--log-max`` of it, counted
    in the member's stored bytes, and the member reads it with ``logs --notify``; another
    member may not."""
    d, work = lab_daemon("--job-max-pids", "64", "--job-max-memory", "128MiB", "--log-max", "1MiB")
    if "jobs confined: cgroup" not in d.read_log():
        pytest.skip(f"cgroups are not writable here: {d.read_log()[-400:]}")
    a = lab["A"]
    escape = _ok(submit_as(a, _sock(d), cwd=str(work), argv=["/bin/true"],
                           notify=["sh", "-c", "sleep 4444 & echo started-$(id -u); cat"]))
    flood = _ok(submit_as(a, _sock(d), cwd=str(work), argv=["/bin/true"],
                          notify=["sh", "-c", "head -c 20000000 /dev/zero | tr '\\0' n"]))
    for job in (escape, flood):
        d.wait_state(job, "done", timeout=60)
    folder = d.state_dir / "jobs" / escape / "notify"
    wait_for(lambda: (folder / "exit.json").exists(), 30, "the notify's runner to record its end")
    assert not _sleepers("4444")  # stopped with the notify's cgroup
    shown = cli_as(a, d.state_dir, "logs", escape, "--notify")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"started-{a.uid}"  # as the member
    assert f"collocate job {escape} (true) done" in shown.stdout  # the summary on its stdin
    wait_for(lambda: (d.state_dir / "jobs" / flood / "notify" / "exit.json").exists(), 60,
             "the flooding notify to end")
    log = d.state_dir / "jobs" / flood / "notify" / "stdout.log"
    assert log.stat().st_size < 2**20 + 128 * 1024  # --log-max, and its kept tail
    big = cli_as(a, d.state_dir, "logs", flood, "--notify")
    assert "of stdout were cut here" in big.stdout
    theirs = cli_as(lab["B"], d.state_dir, "logs", escape, "--notify")
    assert theirs.returncode != 0 and "belongs to collocate-a" in theirs.stderr


def test_a_notify_past_its_time_limit_is_stopped_with_all_it_started(tmp_path):
    """The runner's ``--time-limit`` (a notify's, 60 s by default): the command and what it
    left in the background are stopped, and the record says so."""
    import subprocess

    from collocate.node.isolate import bootstrap_argv, write_command_file, write_env_file

    write_env_file(tmp_path / "env.json", {"PATH": "/usr/bin:/bin"})
    write_command_file(tmp_path / "command.json", ["sh", "-c", "sleep 4445 & sleep 4446"])
    (tmp_path / "stdin.txt").write_text("summary\n")
    started = time.monotonic()
    subprocess.run([*bootstrap_argv("collocate.node.runner"), "--dir", str(tmp_path), "--cwd", "/",
                    "--env-file", str(tmp_path / "env.json"), "--command-file",
                    str(tmp_path / "command.json"), "--stdin-file", str(tmp_path / "stdin.txt"),
                    "--time-limit", "1"], check=True, timeout=60, start_new_session=True)
    assert time.monotonic() - started < 30
    record = json.loads((tmp_path / "exit.json").read_text())
    assert "time limit of 1 s" in record["timed_out"] and record["returncode"] == -9
    assert not _sleepers("4445") and not _sleepers("4446")
    assert not (tmp_path / "command.json").exists()  # read and removed


# -- finding 3: quotas hold while jobs run, retries included --------------------------------------
@pytest.mark.parametrize("gpus", [1, 0], ids=["gpu-job", "cpu-job"])
def test_retries_and_notifies_stop_at_the_members_quota_not_the_disk(lab, lab_daemon, gpus):
    """The issue's reproduction: a job failing 20 times after 9 MB of output each. Its logs
    stop at A's 8 MiB quota (the cut said in the log), it gets no new attempt (it waits with
    the quota as its reason), A's submits are refused, and B's job runs untouched beside it.
    The same for a CPU job (``--gpus 0``), whose queue is not the GPU queue."""
    d, work = lab_daemon("--user-max-stored", "8MiB", "--log-max", "4MiB", disk_mib=64)
    a, b = lab["A"], lab["B"]
    flood = _ok(submit_as(a, _sock(d), cwd=str(work), retries=20, gpus=gpus, mem="1GiB" if gpus else None,
                          argv=["/bin/sh", "-c", "yes A | head -c 9000000; exit 1"]))
    wait_for(lambda: d.job(flood)["state"] == "pending" and d.job(flood)["attempts_used"] >= 2
             and "quota" in (d.job(flood)["reason"] or ""), 120, "the flood to stop at A's quota")
    detail = d.job(flood)
    assert detail["wait"] == "quota" and "--user-max-stored" in detail["reason"], detail
    used = detail["attempts_used"]
    logs = sum(f.stat().st_size for f in (d.state_dir / "jobs" / flood).rglob("*.log"))
    # the quota, and per attempt what a cut stream adds at its end (its last 64 KiB, two lines)
    assert logs <= 8 * 2**20 + used * 2 * (64 * 1024 + 512), (logs, used)
    time.sleep(3)  # rounds go by: still no new attempt
    assert d.job(flood)["attempts_used"] == used and d.job(flood)["state"] == "pending"
    last = cli_as(a, d.state_dir, "logs", flood)
    assert "passed their storage quota" in last.stdout or "passed its limit" in last.stdout
    refused = submit_as(a, _sock(d), cwd=str(work), argv=["/bin/true"])
    assert not refused["ok"] and "--user-max-stored" in refused["hint"]
    theirs = _ok(submit_as(b, _sock(d), cwd=str(work), argv=[
        "/bin/sh", "-c", "yes B | head -c 3000000"]))
    assert d.wait_state(theirs, ("done", "failed"), timeout=60)["state"] == "done"
    out = d.state_dir / "jobs" / theirs / "attempt-1" / "stdout.log"
    assert out.stat().st_size == 3000000  # B's output whole: A's flood cost B nothing
    st = os.statvfs(d.state_dir)
    assert st.f_bavail * st.f_frsize > 32 * 2**20  # far above the reserve


# -- a member frees their own quota (collocate purge) ---------------------------------------------
def test_a_member_at_their_quota_purges_their_own_logs_and_their_job_starts(lab, lab_daemon):
    """A's first job fills A's 8 MiB quota with its log; A's next job waits with the quota as
    its reason. B may not purge A's job (refused, audited); A's own `collocate purge --before
    now` removes A's ended jobs' logs only (B's stay), frees the ledger, and A's job starts."""
    d, work = lab_daemon("--user-max-stored", "8MiB", "--log-max", "16MiB", disk_mib=64)
    a, b = lab["A"], lab["B"]
    flood = _ok(submit_as(a, _sock(d), cwd=str(work), hold=True, argv=["/bin/sh", "-c", "yes A | head -c 9000000"]))
    queued = _ok(submit_as(a, _sock(d), cwd=str(work), after=[flood], argv=["/bin/echo", "after-purge"]))
    assert raw_requests(a, _sock(d), [json.dumps({"op": "release", "args": {"id": flood}}).encode()])[0]["ok"]
    theirs = _ok(submit_as(b, _sock(d), cwd=str(work), argv=["/bin/echo", "b-keeps-this"]))
    d.wait_state(flood, ("done", "failed"), timeout=60)
    d.wait_state(theirs, "done", timeout=60)
    wait_for(lambda: d.job(queued)["wait"] == "quota", 60, "A's next job to wait for A's quota")
    assert "collocate purge" in d.job(queued)["reason"]
    flood_log = d.state_dir / "jobs" / flood / "attempt-1" / "stdout.log"
    assert flood_log.stat().st_size >= 7 * 2**20

    early = cli_as(a, d.state_dir, "purge", queued)  # pending: nothing to remove yet
    assert early.returncode != 0 and "only an ended job's logs are purged" in early.stderr, early.stderr
    refused = cli_as(b, d.state_dir, "purge", flood)
    assert refused.returncode != 0 and "may not purge the logs of job" in refused.stderr, refused.stderr
    assert flood_log.exists()
    audit = [json.loads(line) for line in (d.state_dir / "audit.log").read_text().splitlines()]
    assert any(e.get("op") == "purge" and e.get("user") == b.name for e in audit), audit[-3:]

    purged = cli_as(a, d.state_dir, "purge", "--before", "now")
    assert purged.returncode == 0, purged.stderr
    assert "purged the logs of 1 jobs" in purged.stdout and "MiB freed" in purged.stdout, purged.stdout
    assert not flood_log.exists()
    assert (d.state_dir / "jobs" / theirs / "attempt-1" / "stdout.log").read_text() == "b-keeps-this\n"
    assert d.wait_state(queued, ("done", "failed"), timeout=60)["state"] == "done"
    assert cli_as(a, d.state_dir, "logs", queued).stdout.strip() == "after-purge"
    assert d.job(flood)["state"] == "done"  # the record stays
    said = cli_as(a, d.state_dir, "logs", flood)  # and `logs` says where the output went
    assert said.returncode == 0 and said.stdout == "" and "were purged" in said.stderr, said
    ledger = int((d.state_dir / "quota" / str(a.uid)).read_text())
    assert ledger > 7 * 2**20, ledger  # the freed bytes are A's again
