"""A full disk under the state dir (issue 19, finding 8), on a real 8 MiB tmpfs: a job that
succeeds while the disk is full is recorded done once there is space again, submits say "disk
full", and the daemon goes on (no job is placed while it could not record the launch)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from daemon_harness import Daemon, wait_for

from collocate.common.errors import CollocateError


@pytest.fixture
def small_disk(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def daemon(small_disk):
    d = Daemon(small_disk / "state", ["--gpus", "emulated:1xA100-40GB", "--period", "0.1"])
    d.start()
    yield d
    d.kill_all()


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_job_that_succeeds_on_a_full_disk_is_recorded_done(daemon, small_disk, tmp_path):
    d = daemon  # one emulated A100 on an 8 MiB tmpfs
    flag = tmp_path / "go"
    job = d.submit(["/bin/sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 0"], mem="1GiB")
    d.wait_state(job, "running")
    filler = _fill(small_disk)
    flag.touch()  # the job ends now, successfully, while nothing can be written
    with pytest.raises(CollocateError, match="disk full"):
        d.submit(["/bin/true"], mem="1GiB")
    assert d.job(job)["state"] == "running"  # not failed: its exit is not recorded yet
    filler.unlink()
    done = d.wait_state(job, ("done", "failed"), timeout=30)
    assert done["state"] == "done", done
    assert d.proc.poll() is None
    later = d.submit(["/bin/true"], mem="1GiB")
    assert d.wait_state(later, ("done", "failed"))["state"] == "done"
    assert len(d.job(job)["attempts"]) == 1  # and it ran once


def test_a_pending_job_says_it_waits_for_disk_space(daemon, small_disk, tmp_path):
    d = daemon  # one emulated A100 on an 8 MiB tmpfs
    flag = tmp_path / "go"
    holder = d.submit(["/bin/sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done"], mem="39GiB")
    d.wait_state(holder, "running")
    waiting = d.submit(["/bin/true"], mem="10GiB")
    wait_for(lambda: d.job(waiting)["wait"] == "memory", 10, "a round to price the waiting job")
    filler = _fill(small_disk)
    row = d.job(waiting)
    assert row["wait"] == "disk" and "full" in row["reason"], row
    filler.unlink()
    flag.touch()
    assert d.wait_state(waiting, ("done", "failed"), timeout=30)["state"] == "done"
