"""A job store that is gone, empty, replaced, corrupt or read-only (issue 19, finding 9): the
daemon refuses to start with a clear error rather than reuse job ids or fail every write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import job_argv

from collocate.common.errors import CollocateError
from collocate.daemon.store import Store


def _serve(state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(state),
                           "--gpus", "emulated:1xA100-40GB"], capture_output=True, text=True, timeout=60)


@pytest.fixture
def used_state(daemons):
    """A state dir whose daemon ran one job and was stopped."""
    d = daemons(gpus="emulated:1xA100-40GB")
    job = d.submit(job_argv(300, 0.1), mem="1GiB")
    d.wait_state(job, "done")
    d.kill()
    return d.state_dir


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_lost_store_is_refused_not_restarted_from_job_1(used_state, damage):
    db = used_state / "collocate.common.sqlite"
    for extra in ("-wal", "-shm"):
        Path(str(db) + extra).unlink(missing_ok=True)
    if damage == "delete":
        db.unlink()
    else:
        db.write_bytes(b"")
    out = _serve(used_state)
    assert out.returncode != 0
    assert f"is {'missing' if damage == 'delete' else 'empty'}, but this state dir had jobs" in out.stderr
    assert "Traceback" not in out.stderr
    # also when only the attempt dirs remain (a state dir from before the marker existed)
    (used_state / "collocate.common.sqlite.id").unlink()
    assert "had jobs" in _serve(used_state).stderr


def test_corrupt_pages_give_a_clear_error(used_state):
    db = used_state / "collocate.common.sqlite"
    subprocess.run([sys.executable, "-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]);"
                    "c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()", str(db)], check=True)
    data = bytearray(db.read_bytes())
    assert len(data) >= 4 * 4096
    data[4096 + 100:4096 * 3] = os.urandom(4096 * 3 - 4096 - 100)  # pages 2-3, header kept
    db.write_bytes(bytes(data))
    out = _serve(used_state)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "corrupt" in out.stderr or "malformed" in out.stderr, out.stderr


def test_a_replaced_store_is_refused(used_state, tmp_path):
    other = tmp_path / "other" / "collocate.common.sqlite"
    other.parent.mkdir()
    Store(other).close()
    for extra in ("", "-wal", "-shm"):
        Path(str(used_state / "collocate.common.sqlite") + extra).unlink(missing_ok=True)
    os.replace(other, used_state / "collocate.common.sqlite")
    assert "is not the one this state dir used" in _serve(used_state).stderr


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to mount a read-only file system")
def test_a_read_only_store_is_refused_at_start(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        Store(mnt / "collocate.common.sqlite").close()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(CollocateError, match="read-only"):
            Store(mnt / "collocate.common.sqlite")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
