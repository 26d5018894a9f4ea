"""Per-attempt cgroups and the runner's fallback without them (issue 31, item 1), with real
processes: v1 hierarchies where this machine has them writable, the cgroup v2 mount for what it
can do without controllers (move a process in, kill the whole tree), and the process-group
fallback a runner uses where no cgroup can be made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collocate.node.cgroups import AttemptCgroup, Cgroups, gpu_denials
from collocate.node.isolate import bootstrap_argv
from collocate.node.jobtree import JobTree


def _tree_in(cgroup: AttemptCgroup) -> subprocess.Popen:
    """A shell that moves itself into ``cgroup`` and leaves a ``setsid`` grandchild behind."""
    procs = " ".join(f"{d}/cgroup.procs" for d in cgroup.dirs.values())
    script = f'for f in {procs}; do echo $$ > "$f"; done; setsid sleep 600 & exec sleep 600'
    return subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)


def _all_in(cgroup: AttemptCgroup, n: int) -> set[int]:
    deadline = time.monotonic() + 10
    while len(cgroup.pids()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return cgroup.pids()


def test_without_cgroup_mounts_jobs_are_not_confined_and_it_says_why(tmp_path: Path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text("22 1 0:21 / / rw - ext4 /dev/root rw\n")
    (proc / "cgroup").write_text("0::/\n")
    cgroups = Cgroups.detect("k", proc=proc)
    assert not cgroups.available and cgroups.attempt("1", 1) is None
    assert cgroups.describe().startswith("jobs NOT confined: no cgroup hierarchy is mounted")


def test_gpu_denials_are_the_nodes_other_gpus():
    assert gpu_denials([1], [0, 1, 2, None]) == ((195, 0), (195, 2))
    assert gpu_denials([None], [None]) == ()


def test_a_v1_attempt_cgroup_kills_its_whole_tree(tmp_path: Path):
    cgroups = Cgroups.detect(str(tmp_path))
    if cgroups.version != 1:
        pytest.skip(f"no writable cgroup v1 here: {cgroups.describe()}")
    cgroup = cgroups.attempt("1", 1, gpu_denials([0], [0, 1]))
    assert cgroup is not None and AttemptCgroup.from_json(json.loads(json.dumps(cgroup.to_json()))) == cgroup
    cgroup.create()
    tree = _tree_in(cgroup)
    try:
        pids = _all_in(cgroup, 2)
        assert len(pids) == 2 and tree.pid in pids  # the setsid'd sleep did not leave it
        assert cgroup.kill() and not cgroup.pids()
        assert tree.wait(timeout=10) == -9
        assert "memory_peak_bytes" in cgroup.usage()
    finally:
        cgroup.kill()
        cgroup.remove()
        cgroups.close()
    assert not any(os.path.exists(d) for d in cgroup.dirs.values())


def test_a_v2_cgroup_takes_a_tree_and_kills_it(tmp_path: Path):
    mount = next((line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if " - cgroup2 " in line), None)
    if mount is None or os.getuid() != 0:
        pytest.skip("needs root and a cgroup v2 mount")
    leaf = Path(mount) / f"collocate-test-{os.getpid()}"
    cgroup = AttemptCgroup(2, {"unified": str(leaf)}, max_pids=None, max_memory=None)
    try:
        cgroup.create()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {mount}: {exc}")
    tree = _tree_in(cgroup)
    try:
        assert len(_all_in(cgroup, 2)) == 2
        assert cgroup.kill() and not cgroup.pids()  # cgroup.kill: one write, the whole tree
        assert tree.wait(timeout=10) == -9
    finally:
        cgroup.kill()
        cgroup.remove()
    assert not leaf.exists()


def test_without_a_cgroup_the_runner_stops_its_process_group(tmp_path: Path):
    """The fallback: what the job left in its process group (``nohup cmd &``) is stopped when
    it ends; ``setsid`` would escape it, which is why cgroups are used where they can be."""
    adir = tmp_path / "attempt"
    adir.mkdir()
    (adir / "env.json").write_text(json.dumps({"PATH": "/usr/bin:/bin"}))
    marker = f"sleep {600 + os.getpid() % 97}"
    argv = [*bootstrap_argv("collocate.node.runner"), "--dir", str(adir), "--cwd", str(tmp_path),
            "--env-file", str(adir / "env.json"), "--", "/bin/sh", "-c", f"nohup {marker} >/dev/null 2>&1 & exit 0"]
    with open(adir / "stdout.log", "ab") as out, open(adir / "stderr.log", "ab") as err:
        runner = subprocess.run(argv, stdout=out, stderr=err, start_new_session=True, timeout=60)
    assert runner.returncode == 0
    assert json.loads((adir / "exit.json").read_text())["returncode"] == 0
    left = subprocess.run(["pgrep", "-f", f"^{marker}$"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def test_a_job_tree_without_a_plan_is_unconfined():
    tree = JobTree.confined(None)
    assert tree.cgroup is None and tree.usage() == {} and tree.memory_note() is None
    tree.enter()  # nothing to enter
    assert sys.platform.startswith("linux")
