"""Bad input is refused at submit time with a clear error and nothing stored; strangers refused."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from daemon_harness import job_argv

from collocate.client.connect import Client
from collocate.common.errors import CollocateError
from collocate.common.tls import cert_fingerprint

CLI = [sys.executable, "-m", "collocate.cli"]


def run_cli(d, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir)}
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


BAD_SUBMITS = [
    (["submit", "--mem", "1GiB"], "empty command"),
    (["submit", "--bogus", "--", "true"], "No such option"),
    (["submit", "--cwd", "/nonexistent/dir", "--", "true"], "does not exist"),
    (["submit", "--gpus", "3", "--", "true"], "needs 3 GPUs on one node but the largest node has 2"),
    (["submit", "--mem", "80GiB", "--", "true"], "the largest GPU has"),
    (["submit", "--mem", "6 lots", "--", "true"], "cannot read memory size"),
    (["submit", "--env", "NOEQUALS", "--", "true"], "cannot read --env"),
    (["submit", "--env", "CUDA_VISIBLE_DEVICES=0", "--", "true"], "set by the daemon"),
    (["submit", "--gpus", "-1", "--", "true"], "--gpus must be at least 0"),
    (["submit", "--gpus", "0", "--mem", "1GiB", "--", "true"], "a CPU job (--gpus 0) holds none"),
    (["submit", "--gpus", "0", "--nodes", "2", "--", "true"], "a CPU job (--gpus 0) runs on one node"),
    (["submit", "--dataset", "tiny", "--", "true"], "needs a factory"),
    (["submit", "--dataset-factory", "data:make", "--", "true"], "--dataset-factory needs --dataset"),
]


def test_bad_submit_is_refused_and_nothing_stored(daemons):
    d = daemons()  # one daemon for all cases: each start costs seconds on a small machine
    for args, message in BAD_SUBMITS:
        out = run_cli(d, *args)
        assert out.returncode != 0, args
        assert message in out.stderr + out.stdout, (args, out.stderr)
    assert d.client.request("ls", all=True) == []


def test_api_rejects_bad_fields_directly(daemons):
    d = daemons()
    for bad in ({"argv": []}, {"argv": ["x"], "cwd": "relative"}, {"argv": ["x"], "cwd": "/", "retries": -1},
                {"argv": ["x"], "cwd": "/", "gpus": "two"}):
        with pytest.raises(CollocateError):
            d.client.request("submit", **bad)
    with pytest.raises(CollocateError, match="unknown request"):
        d.client.request("format-disk")
    assert d.client.request("ls", all=True) == []


def test_client_without_daemon_says_how_to_start_it(tmp_path):
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(tmp_path / "none")}
    out = subprocess.run([*CLI, "ls"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0
    assert "not running" in out.stderr and "collocate serve" in out.stderr


def test_second_daemon_on_same_state_dir_is_refused(daemons):
    d = daemons()
    out = subprocess.run([*CLI, "serve", "--state-dir", str(d.state_dir), "--gpus", "emulated:2xA100-40GB"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "already runs" in out.stderr
    d.client.request("ping")


def test_socket_and_state_dir_are_private(daemons):
    d = daemons()
    assert oct(os.stat(d.state_dir).st_mode & 0o777) == "0o700"
    assert oct(os.stat(d.state_dir / "collocate.sock").st_mode & 0o777) == "0o600"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_other_user_is_refused_even_when_the_socket_is_reachable(daemons):
    base = Path(tempfile.mkdtemp(prefix="collocate-test-"))  # pytest's tmp is private to root
    os.chmod(base, 0o755)
    try:
        _check_refused(daemons(name=str(base / "state")))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _check_refused(d) -> None:
    # Open the file-system lock on purpose, so only the peer-credential check stands in the way.
    os.chmod(d.state_dir, 0o755)
    os.chmod(d.state_dir / "collocate.sock", 0o777)
    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "s.sendall(b'{\"op\": \"ls\", \"args\": {}}\\n')\n"
        "print(s.makefile('rb').readline().decode())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(d.state_dir / "collocate.sock")],
                         capture_output=True, text=True, timeout=30, check=False)
    assert '"ok":false' in out.stdout and "may not use this collocate daemon" in out.stdout
    os.chmod(d.state_dir / "collocate.sock", 0o600)
    os.chmod(d.state_dir, 0o700)


def test_tcp_needs_the_token(daemons, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token_file = tmp_path / "token"
    token_file.write_text("a-long-random-test-token-0123456789\n")
    token_file.chmod(0o600)
    d = daemons("--tcp", f"127.0.0.1:{port}", "--token-file", str(token_file))
    pin = cert_fingerprint(d.state_dir / "tls" / "cert.pem")
    good = Client(d.state_dir, tcp=("127.0.0.1", port), token="a-long-random-test-token-0123456789",
                  fingerprint=pin)
    job = good.request("submit", argv=job_argv(300, 0.2), cwd=str(tmp_path), mem="1GiB")["id"]
    assert good.request("show", id=job)["user"]
    for token in ("wrong-token-wrong-token-wrong", None):
        with pytest.raises(CollocateError, match="token"):
            Client(d.state_dir, tcp=("127.0.0.1", port), token=token, fingerprint=pin).request("ls")
