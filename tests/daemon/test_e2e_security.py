"""A daemon a lab can share (issue 19): a root daemon attacked by a group member, with real processes.

The second Unix user is ``nobody`` (uid/gid 65534, group ``nogroup``); these tests need root to
start a root daemon and to become that user, and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from daemon_harness import Daemon, job_argv, wait_for

NOBODY = 65534


def _has_nogroup() -> bool:
    import grp

    try:
        return grp.getgrnam("nogroup").gr_gid == NOBODY
    except KeyError:
        return False


pytestmark = pytest.mark.skipif(os.getuid() != 0 or not _has_nogroup(),
                                reason="needs root (a root daemon) and the nobody/nogroup user")

SUBMIT_AS_NOBODY = (
    "import json, os, socket, sys\n"
    "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
    "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
    "s.sendall(sys.argv[2].encode() + b'\\n')\n"
    "print(s.makefile('rb').readline().decode())\n"
)


@pytest.fixture
def shared(daemons):
    """A root daemon serving group nogroup, and a world-writable work dir for nobody."""
    base = Path(tempfile.mkdtemp(prefix="collocate-sec-"))
    os.chmod(base, 0o755)
    work = base / "work"
    work.mkdir()
    os.chmod(work, 0o777)
    try:
        yield daemons("--group", "nogroup", name=str(base / "state")), work
    finally:
        shutil.rmtree(base, ignore_errors=True)


def submit_as_nobody(d: Daemon, **args) -> dict:
    out = subprocess.run([sys.executable, "-c", SUBMIT_AS_NOBODY, str(d.state_dir / "collocate.sock"),
                          json.dumps({"op": "submit", "args": {"mem": "1GiB", **args}})],
                         capture_output=True, text=True, timeout=60, check=False)
    return json.loads(out.stdout)


def _plant(work: Path, marker: Path) -> dict[str, str]:
    """Code that records who imported it: a fake ``collocate`` package in the cwd and a
    ``sitecustomize`` on the submitted PYTHONPATH."""
    record = f"import os\nwith open({str(marker)!r}, 'a') as f: f.write(f'{{os.getuid()}}\\n')\n"
    (work / "collocate").mkdir()
    (work / "collocate" / "__init__.py").write_text(record)
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(record)
    (work / "evil_data.py").write_text(record + "def make():\n    raise SystemExit('no loader')\n")
    for p in (work / "collocate", site):
        os.chmod(p, 0o777)
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}


def test_group_member_cannot_run_code_as_root(shared):
    """A cwd holding collocate/__init__.py, a PYTHONPATH with sitecustomize.py, LD_PRELOAD and a
    --dataset-factory: whatever of it runs, runs as the submitter, never as root."""
    d, work = shared
    marker = work / "imported-by"
    env = {**_plant(work, marker), "LD_PRELOAD": str(work / "nope.so")}
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # one nobody may run
    reply = submit_as_nobody(d, argv=[python, "-c", "import os; print(os.getuid())"],
                             cwd=str(work), base_env=env)
    assert reply["ok"], reply
    job = d.wait_state(reply["result"]["id"], ("done", "failed"))
    assert d.client.request("logs", id=job["id"])["text"].strip() == str(NOBODY), (
        job, d.client.request("logs", id=job["id"], stream="stderr"))
    reply = submit_as_nobody(d, argv=["/bin/true"], cwd=str(work), base_env=env,
                             dataset="evil", dataset_factory="evil_data:make")
    assert reply["ok"], reply
    d.wait_state(reply["result"]["id"], ("done", "failed"), timeout=60)
    seen = marker.read_text().split()
    assert seen and set(seen) == {str(NOBODY)}, seen  # only ever imported as the submitter
    # the producer ran as nobody too: it imported the factory, or (where nobody may not run
    # the daemon's python, as on a dev machine whose python is under /root) could not even exec
    log = (d.state_dir / "share" / "evil.log").read_text(errors="replace")
    assert len(seen) == 2 or "Permission denied" in log, log


def test_root_only_cwd_is_refused_like_a_missing_one(shared):
    d, _ = shared
    private = Path(tempfile.mkdtemp(prefix="collocate-root-only-"))
    os.chmod(private, 0o700)
    try:
        errors = [submit_as_nobody(d, argv=["/bin/true"], cwd=cwd)["error"]
                  for cwd in (str(private), str(private) + "-missing")]
    finally:
        shutil.rmtree(private)
    assert "does not exist or you cannot enter it" in errors[0]
    assert errors[0].replace(str(private), "X") == errors[1].replace(str(private) + "-missing", "X")


def test_state_files_are_private_and_secrets_stay_there(shared):
    d, work = shared
    reply = submit_as_nobody(d, argv=["/bin/sh", "-c", "echo ran"], cwd=str(work),
                             base_env={"PATH": "/usr/bin:/bin", "API_KEY": "s3cret-value-42"})
    job = d.wait_state(reply["result"]["id"], "done")
    wait_for(lambda: (d.state_dir / "monitor.sqlite").exists(), 10, "the monitoring store")
    for name in ("collocate.common.sqlite", "collocate.common.sqlite-wal", "collocate.common.sqlite-shm", "monitor.sqlite",
                 "daemon.log"):
        path = d.state_dir / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
    assert stat.S_IMODE(d.state_dir.stat().st_mode) == 0o710
    reader = ("import os, sys\nos.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
              "try:\n    open(sys.argv[1], 'rb').read(); print('read')\nexcept OSError: print('denied')\n")
    out = subprocess.run([sys.executable, "-c", reader, str(d.state_dir / "collocate.common.sqlite")],
                         capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "denied"
    # the API shows no environment; the env file the runner read is gone
    shown = json.dumps([d.client.request("show", id=job["id"]), d.client.request("ls", all=True)])
    assert "s3cret-value-42" not in shown
    assert not list(d.state_dir.glob("jobs/*/attempt-*/env.json"))


def test_state_dir_of_another_user_or_with_a_planted_symlink_is_refused(tmp_path):
    from collocate.common.errors import CollocateError
    from collocate.wire.paths import StateLayout

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(CollocateError, match="owned by uid 65534"):
        StateLayout(theirs).create()
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    secret = tmp_path / "root-only"
    secret.write_text("x")
    (planted / "daemon.log").symlink_to(secret)
    with pytest.raises(CollocateError, match="symbolic link"):
        StateLayout(planted).create()
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    (open_to_all / "collocate.common.sqlite").write_text("")
    os.chmod(open_to_all, 0o777)
    with pytest.raises(CollocateError, match="writable by others"):
        StateLayout(open_to_all).create()
    assert secret.read_text() == "x"
    # a daemon refuses to start on it, with the reason and no traceback
    out = subprocess.run([sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(theirs),
                          "--gpus", "emulated:1xA100-40GB"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "owned by uid 65534" in out.stderr and "Traceback" not in out.stderr


def test_bad_environment_fails_at_submit_and_never_blocks_a_round(daemons, tmp_path):
    d = daemons()
    for env in ({"": "x"}, {"A=B": "x"}, {"A\0": "x"}, {"GOOD": "nul\0inside"}):
        with pytest.raises(Exception, match="environment variable"):
            d.client.request("submit", argv=["/bin/true"], cwd=str(tmp_path), mem="1GiB", base_env=env)
    with pytest.raises(Exception, match="NUL"):
        d.client.request("submit", argv=["/bin/echo", "a\0b"], cwd=str(tmp_path), mem="1GiB")
    ids = [d.submit(job_argv(300, 0.2), mem="1GiB") for _ in range(3)]
    assert all(d.wait_state(i, ("done", "failed"))["state"] == "done" for i in ids)


def test_a_launch_failure_is_confined_to_its_job(daemons, tmp_path):
    """Job 2's attempt dir cannot be made: job 2 fails with the reason; jobs placed in the same
    round (1 and 3) run, and nothing stays running without a process, after a restart too."""
    d = daemons()
    d.client.request("drain")
    ids = [d.submit(job_argv(300, 0.3), mem="1GiB") for _ in range(3)]
    (d.state_dir / "jobs" / ids[1]).write_text("in the way")
    d.client.request("resume")
    states = {i: d.wait_state(i, ("done", "failed"))["state"] for i in ids}
    assert states == {ids[0]: "done", ids[1]: "failed", ids[2]: "done"}
    assert "could not start the job" in d.job(ids[1])["reason"]
    d.kill()
    d.start()
    assert not d.client.request("ls")  # nothing pending or running


def test_root_daemon_runs_a_group_members_job_as_that_user(shared):
    """A member submits over the socket; the job runs as the member, in the member's cwd."""
    d, work = shared
    reply = submit_as_nobody(d, argv=["/bin/sh", "-c", "id -u; touch mine"], cwd=str(work),
                             base_env={"PATH": "/usr/bin:/bin"})
    assert reply["ok"], reply
    job = reply["result"]["id"]
    done = d.wait_state(job, ("done", "failed"))
    assert done["state"] == "done", done
    assert done["user"] == "nobody"
    assert d.client.request("logs", id=job)["text"].strip() == "65534"
    assert os.stat(work / "mine").st_uid == 65534
