"""The warm estimator (``estimate/warm.py``) as a real process on a real socket: it answers
exactly what the cold path answers, in the client's directory, relays the client's input
errors, forks with one thread, and serves only its own user."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collocate.common.errors import InputError
from collocate.estimate.api import estimate_memory
from collocate.estimate.warm import ask, command

HERE = Path(__file__).parent
REQUEST = dict(optimizer=None, precision="fp32", gpu="A100-80GB", fallbacks=("cpu-run",),
               allocator="default")
READY_TIMEOUT_S = 240.0  # imports torch and traces two small models: slow on a loaded machine


@pytest.fixture(scope="module")
def warm() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """As root, it serves ``nogroup`` too (as ``serve --group nogroup`` would), from a directory
    members can traverse, for the test with real users."""
    import grp
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="collocate-warm-"))
    sock = where / "estimator.sock"
    gid = None
    if os.getuid() == 0:
        gid = grp.getgrnam("nogroup").gr_gid
        where.chmod(0o711)
    proc = subprocess.Popen(command(sock, gid))
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not sock.exists():
            assert proc.poll() is None, "the warm estimator exited while warming up"
            assert time.monotonic() < deadline, "the warm estimator did not listen in time"
            time.sleep(0.1)
        yield sock, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        left = sock.exists()
        shutil.rmtree(where)
    assert not left, "the warm estimator left its socket behind"


def test_answers_exactly_as_the_cold_path_from_the_clients_directory(warm, monkeypatch) -> None:
    sock, _ = warm
    monkeypatch.chdir(HERE)  # `_entries` resolves from the client's directory, as cold
    for entry, batch in (("_entries:tiny_mlp", 16), ("_entries:tiny_transformer", 2)):
        hot = ask(sock, entry_point=entry, batch_size=batch, **REQUEST)
        assert hot is not None, f"the warm estimator gave no answer for {entry}"
        cold = estimate_memory(entry, batch_size=batch, **REQUEST)
        assert hot.to_dict() == cold.to_dict()


def test_relays_the_clients_input_errors_word_for_word(warm, tmp_path, monkeypatch) -> None:
    sock, _ = warm
    monkeypatch.chdir(tmp_path)
    for entry in ("no_such_module_here:build", "_entries:tiny_mlp:x"):
        with pytest.raises(InputError) as hot:
            ask(sock, entry_point=entry, batch_size=4, **REQUEST)
        with pytest.raises(InputError) as cold:
            estimate_memory(entry, batch_size=4, **REQUEST)
        assert str(hot.value) == str(cold.value)
        assert str(tmp_path) in str(hot.value) or "package.module:function" in str(hot.value)


def test_forks_with_one_thread_and_no_children_left(warm, monkeypatch) -> None:
    sock, proc = warm
    monkeypatch.chdir(HERE)
    assert ask(sock, entry_point="_entries:linear_only", batch_size=4, **REQUEST) is not None
    assert len(os.listdir(f"/proc/{proc.pid}/task")) == 1  # no OpenMP or BLAS pool to lose in a fork
    deadline = time.monotonic() + 10
    while _children(proc.pid) and time.monotonic() < deadline:  # reaped within a poll period
        time.sleep(0.1)
    assert _children(proc.pid) == []


def _children(pid: int) -> list[str]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return path.read_text().split()


def test_no_socket_means_no_answer(tmp_path) -> None:
    assert ask(tmp_path / "estimator.sock", entry_point="_entries:tiny_mlp", batch_size=4,
               **REQUEST) is None


_AS_USER = """
import json, pathlib, sys
from collocate.estimate.warm import ask
est = ask(pathlib.Path(sys.argv[1]), entry_point="whoami_entry:build", batch_size=4,
          optimizer=None, precision="fp32", gpu="A100-80GB", fallbacks=(), allocator="default")
print(json.dumps(est and est.mib))
"""

_WHOAMI = """
import os
from collocate.workloads.models import build_mlp

def build(batch_size):
    with open("ran-as", "w") as f:
        f.write(str(os.getuid()))
    return build_mlp(batch_size, in_features=8, width=8, depth=1, classes=2)
"""


def test_a_member_is_answered_as_themself_and_an_outsider_not_at_all(warm) -> None:
    """Root's warm estimator serving ``nogroup``: its child becomes the member (the entry point
    runs with their uid, in their directory); a user outside the group cannot connect."""
    import sys

    if os.getuid() != 0:
        pytest.skip("needs root: a root warm estimator, and users to become")
    sys.path.insert(0, str(HERE.parent / "daemon"))
    from lab import lab_users, run_as

    users = lab_users()
    sock, _ = warm
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="collocate-warm-work-"))  # a directory members can use
    work.chmod(0o777)
    try:
        _member_and_outsider(users, sock, work, run_as)
    finally:
        shutil.rmtree(work)


def _member_and_outsider(users, sock: Path, work: Path, run_as) -> None:
    (work / "whoami_entry.py").write_text(_WHOAMI)
    member = run_as(users["B"], _AS_USER, str(sock), cwd=str(work))
    assert member.stdout.split()[-1] != "null", member.stderr
    ran_as = work / "ran-as"
    assert ran_as.read_text() == str(users["B"].uid)
    assert ran_as.stat().st_uid == users["B"].uid
    ran_as.unlink()
    outsider = run_as(users["E"], _AS_USER, str(sock), cwd=str(work))
    assert outsider.stdout.split()[-1] == "null"  # no answer: the command estimates cold
    assert not ran_as.exists()


_LINGERS = """
import subprocess
from collocate.workloads.models import build_mlp

def build(batch_size):
    with open("cgroup-of", "w") as f:
        f.write(open("/proc/self/cgroup").read())
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)  # outlives the estimate
    with open("left-pid", "w") as f:
        f.write(str(left.pid))
    return build_mlp(batch_size, in_features=8, width=8, depth=1, classes=2)
"""


def test_a_root_estimators_child_runs_in_a_cgroup_of_its_own_and_leaves_nothing(
        warm, tmp_path, monkeypatch) -> None:
    """As a job's attempt: the member's code runs in a cgroup made for the request (pids and
    memory bounded, not the daemon's), and what it left running dies with it."""
    from collocate.node.cgroups import Cgroups

    if os.getuid() != 0:
        pytest.skip("needs root: only a root warm estimator confines its children")
    probe = Cgroups.detect("test-warm-estimator-probe")
    probe.close()
    if not probe.available:
        pytest.skip(f"no writable cgroups here: {probe.why}")
    sock, proc = warm
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lingers_entry.py").write_text(_LINGERS)
    assert ask(sock, entry_point="lingers_entry:build", batch_size=4, **REQUEST) is not None
    own = [line.split(":", 2)[2] for line in (tmp_path / "cgroup-of").read_text().splitlines()
           if line.split(":", 2)[1] == "pids"]
    assert own and all("/job-estimate." in path for path in own), own
    left = int((tmp_path / "left-pid").read_text())
    mounts = [Path(p) for p in probe.parents.values()]
    leaf = own[0].rsplit("/", 1)[1]

    def cgroup_left() -> bool:
        return any((m.parent / f"collocate-{_key_hash(sock)}" / leaf).exists() for m in mounts)

    # The estimator kills and removes after it reaps the child, a moment after the reply.
    deadline = time.monotonic() + 20
    while ((_alive(left) or _children(proc.pid) or cgroup_left())
           and time.monotonic() < deadline):
        time.sleep(0.1)
    assert not _alive(left), "a process the estimate started outlived it"
    assert not cgroup_left(), "the estimate's cgroup outlived it"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _key_hash(sock: Path) -> str:
    import hashlib

    return hashlib.sha256(f"warm-estimator:{sock}".encode()).hexdigest()[:12]
