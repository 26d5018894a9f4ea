"""Clients anywhere: every client command against a daemon's TCP API over TLS with a token, as
users type them (``--host``, ``COLLOCATE_TOKEN_FILE``, ``COLLOCATE_FINGERPRINT``), and refused
without the token or with a certificate other than the one pinned. A member's own token makes
the daemon treat the client as that member: its jobs run as that user."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from collocate.common.tls import cert_fingerprint, self_signed

CLI = [sys.executable, "-m", "collocate.daemon"]
OWNER_TOKEN = "owner-token-0123456789abcdef"
MEMBER_TOKEN = "member-token-0123456789abcdef"


def secret(path: Path, text: str) -> Path:
    """A token file as its owner keeps it: mode 0600 (one others may read is refused)."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remote(tmp_path: Path, daemons, member: str | None = None):
    port = _port()
    secret(tmp_path / "owner.token", OWNER_TOKEN + "\n")
    secret(tmp_path / "member.token", MEMBER_TOKEN + "\n")
    users = secret(tmp_path / "users", f"# who each token is\n{member or 'root'} {MEMBER_TOKEN}\n")
    d = daemons("--tcp", f"127.0.0.1:{port}", "--tls", "self-signed",
                "--token-file", str(tmp_path / "owner.token"), "--user-tokens", str(users))
    return d, port, cert_fingerprint(d.state_dir / "tls" / "cert.pem")


def _cli(port: int, token: Path | None, pin: str | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLOCATE_")}
    env.update({"COLLOCATE_HOST": f"127.0.0.1:{port}", "COLUMNS": "120",
                "COLLOCATE_STATE_DIR": str(cwd / "nowhere")})  # the socket is not used
    if token is not None:
        env["COLLOCATE_TOKEN_FILE"] = str(token)
    if pin is not None:
        env["COLLOCATE_FINGERPRINT"] = pin
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd)


def test_every_client_command_works_over_tls_with_a_token(daemons, tmp_path: Path):
    d, port, pin = _remote(tmp_path, daemons)
    token = tmp_path / "owner.token"

    def run(*args: str) -> subprocess.CompletedProcess:
        out = _cli(port, token, pin, *args, cwd=tmp_path)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out

    job = run("submit", "--mem", "1GiB", "--", sys.executable, "-c", "print('hello over tls')").stdout.strip()
    run("wait", job)
    assert "hello over tls" in run("logs", job).stdout
    assert job in run("ls", "--all").stdout
    assert "done" in run("show", job).stdout
    held = run("submit", "--hold", "--mem", "1GiB", "--", sys.executable, "-c", "pass").stdout.strip()
    assert "held" in run("hold", held).stdout
    assert "priority -5" in run("priority", held, "--set", "-5").stdout
    assert "released" in run("release", held).stdout
    run("cancel", held)
    assert "GPU" in run("gpus").stdout
    run("limits")
    run("drain")
    run("resume")
    dash = _cli(port, token, pin, "dashboard-url", cwd=tmp_path)
    assert "no dashboard" in dash.stdout + dash.stderr or dash.returncode == 0
    # the command line's own options say the same as the environment
    explicit = subprocess.run([*CLI, "ls", "--all", "--host", f"127.0.0.1:{port}", "--token-file", str(token),
                               "--fingerprint", pin], capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if not k.startswith("COLLOCATE_")})
    assert explicit.returncode == 0 and job in explicit.stdout, explicit.stderr


def test_a_client_without_the_token_or_with_another_certificate_is_refused(daemons, tmp_path: Path):
    d, port, pin = _remote(tmp_path, daemons)
    wrong = tmp_path / "wrong.token"
    secret(wrong, "not-the-token-0123456789\n")
    refused = _cli(port, wrong, pin, "ls", cwd=tmp_path)
    assert refused.returncode != 0 and "missing or wrong token" in refused.stderr
    missing = _cli(port, None, pin, "ls", cwd=tmp_path)
    assert missing.returncode != 0 and "needs your token" in missing.stderr
    other, _ = self_signed(tmp_path / "other-tls", "127.0.0.1")
    mitm = _cli(port, tmp_path / "owner.token", cert_fingerprint(other), "ls", cwd=tmp_path)
    assert mitm.returncode != 0 and "another certificate" in mitm.stderr and "nothing was sent" in mitm.stderr
    clear = _cli(port, tmp_path / "owner.token", None, "ls", cwd=tmp_path)  # no pin, even on loopback
    assert clear.returncode != 0 and "before the daemon proves who it is" in clear.stderr, clear.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a job runs as its member only under a root daemon")
def test_a_members_token_submits_as_that_member(daemons, tmp_path: Path):
    member = pwd.getpwnam("nobody")
    d, port, pin = _remote(tmp_path, daemons, member="nobody")
    out = _cli(port, tmp_path / "member.token", pin, "submit", "--mem", "1GiB", "--cwd", "/tmp", "--",
               "/bin/sh", "-c", "id -u", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert _cli(port, tmp_path / "member.token", pin, "wait", job, cwd=tmp_path).returncode == 0
    shown = d.job(job)
    assert shown["user"] == "nobody" and shown["state"] == "done", shown
    logs = _cli(port, tmp_path / "member.token", pin, "logs", job, cwd=tmp_path)
    assert logs.stdout.strip() == str(member.pw_uid)
