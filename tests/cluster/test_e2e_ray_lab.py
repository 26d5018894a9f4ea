"""Rows 8 and 9 of issue 31's table on a local Ray cluster: Ray's session folder and its token
(row 10, a node lost for good, is ``test_e2e_ray.py``'s
``test_a_node_lost_for_good_has_its_job_fenced_then_run_elsewhere_once``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from daemon_harness import wait_for
from lab import lab_users, run_as

from collocate.cluster.exposure import open_to_others

_RENAME = ("try:\n    os.rename(sys.argv[1], sys.argv[1] + '.moved'); print('renamed')\n"
           "except OSError as e:\n    print('refused', e.errno)\n")


# -- row 8: Ray's session folder ------------------------------------------------------------------
def test_row8_ray_session_folders_are_out_of_other_users_reach(ray_cluster, tmp_path):
    """E cannot touch the sockets of the documented set-up (Ray's --temp-dir under a private
    folder); under a folder that lets others through (Ray's default /tmp/ray) E can, and such a
    folder is what a head refuses."""
    e = lab_users()["E"]
    sockets = next(ray_cluster.temp_dir.glob("session_*/sockets"))
    victim = next(p for p in sockets.iterdir())
    assert run_as(e, _RENAME, str(victim)).stdout.split() == ["refused", "13"]  # EACCES
    assert open_to_others(sockets.parent) is None
    shared = Path(tempfile.mkdtemp(prefix="collocate-ray-open-", dir="/tmp"))
    try:  # what Ray makes of its default folder: everything 0777, in /tmp
        os.chmod(shared, 0o777)
        session = shared / "session_x" / "sockets"
        session.mkdir(parents=True)
        for folder in (shared / "session_x", session):
            os.chmod(folder, 0o777)
        (session / "raylet").write_text("")
        assert run_as(e, _RENAME, str(session / "raylet")).stdout.strip() == "renamed"
        assert "keeps other users out" in (open_to_others(session.parent) or "")
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)


# -- row 9: a cluster without a token ---------------------------------------------------------------
def test_row9_a_cluster_that_answers_without_a_token_is_refused(ray_cluster, tmp_path):
    """Ray started as the old docs said (no token) is refused by ``collocate serve --ray``; the
    documented cluster (with its token) refuses a client that has none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    private = Path(tempfile.mkdtemp(prefix="ray9-")) / "tmp"  # 0700: only the token is missing
    # here; short, as Ray's socket paths must fit 107 bytes
    ray_bin = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--port", str(port), "--num-gpus", "0",
                             "--num-cpus", "1", "--resources", '{"collocate": 1}', "--labels",
                             "collocate-node=open1", "--include-dashboard=false",
                             "--temp-dir", str(private)], env=env, start_new_session=True,
                            stdout=open(tmp_path / "ray.out", "wb"), stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        wait_for(lambda: head.poll() is not None or subprocess.run(
            [ray_bin, "status", "--address", address], env=env, capture_output=True).returncode == 0,
            120, "the open Ray head")
        assert head.poll() is None, (tmp_path / "ray.out").read_text()[-2000:]
        serve = subprocess.run([sys.executable, "-m", "collocate.daemon", "serve", "--ray", address,
                                "--state-dir", str(tmp_path / "state"), "--gpus", "emulated:1xA100-40GB"],
                               env=env, capture_output=True, text=True, timeout=180)
        assert serve.returncode != 0, serve.stderr
        assert "answers clients without a token" in serve.stderr and "Traceback" not in serve.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(private.parent, ignore_errors=True)
    status = subprocess.run([ray_bin, "status", "--address", ray_cluster.address], env=env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode != 0 and "token" in (status.stdout + status.stderr).lower()
