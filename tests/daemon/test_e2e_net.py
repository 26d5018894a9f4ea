"""Nothing one member does over the network reaches another (issue 36, findings 4, 5, 6, 9 and
the low ones): real sockets, real member users, a root daemon.

* a client sends no byte of its token before the daemon proved the pinned certificate: a local
  listener on the port (plain TCP, or TLS with another certificate) gets nothing, loopback too;
* ``serve`` with a taken port exits at once with a clear error (and serves nothing);
* one token holds at most ``--tcp-max-per-token`` connections, others still get through;
* token files others can read are refused; refusals, busy peers and submits are audited;
* the dashboard's token is not the TCP token;
* one daemon per GPU; a member without the profile finds the lab's daemon, and no hint tells a
  member to start their own.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from daemon_harness import Daemon, job_argv, wait_for
from lab import LabDir, User, lab_users, run_as

from collocate.client.connect import Client
from collocate.common.errors import CollocateError
from collocate.common.tls import cert_fingerprint, self_signed

CLI = [sys.executable, "-m", "collocate.daemon"]
OWNER_TOKEN = "owner-token-0123456789abcdef"
MEMBER_TOKEN = "member-token-0123456789abcdef"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _secret(path: Path, text: str, owner: User | None = None) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    return path


@pytest.fixture
def lab() -> dict[str, User]:
    return lab_users()


@pytest.fixture
def lab_daemon(daemons):
    """A root daemon for ``--group nogroup`` (members A and B; E outside) with TCP over TLS,
    the owner's token and A's; returns (daemon, port, pin, LabDir)."""
    made: list[tuple[Daemon, LabDir]] = []

    def make(*args: str) -> tuple[Daemon, int, str, LabDir]:
        where = LabDir()
        users = lab_users()
        _secret(where.base / "owner.token", OWNER_TOKEN + "\n")
        _secret(where.base / "users", f"{users['A'].name} {MEMBER_TOKEN}\n")
        for tries in range(3):  # a free port found here may be another worker's by the time it binds
            port = _port()
            try:
                d = daemons("--group", "nogroup", "--tcp", f"127.0.0.1:{port}", "--token-file",
                            str(where.base / "owner.token"), "--user-tokens", str(where.base / "users"),
                            *args, name=str(where.state))
                break
            except AssertionError as exc:
                if "is in use" not in str(exc) or tries == 2:
                    raise
        made.append((d, where))
        return d, port, cert_fingerprint(d.state_dir / "tls" / "cert.pem"), where

    yield make
    for d, where in made:
        d.kill_all()
        where.close()


def _member_cli(user: User, *argv: str, env: dict[str, str] | None = None, cwd: str = "/") -> subprocess.CompletedProcess:
    """The real CLI as ``user``, with an environment of only ``env`` (no profile: like
    ``ssh host collocate ls``)."""
    code = ("import runpy\nos.environ.clear(); os.environ.update(json.loads(sys.argv[1]))\n"
            "sys.argv = ['collocate', *sys.argv[2:]]\n"
            "runpy.run_module('collocate.daemon', run_name='__main__')\n")
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "COLUMNS": "120"}
    return run_as(user, code, json.dumps({**base, **(env or {})}), *argv, cwd=cwd, check=False)


class _Recorder:
    """A listener that records every byte a client sends it: plain TCP, or TLS with its own
    certificate (what a local non-member could run on the port a member named)."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.context, self.received = context, b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(30)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.settimeout(10)
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            while chunk := conn.recv(65536):
                self.received += chunk
        except OSError:
            pass
        finally:
            conn.close()

    def done(self) -> bytes:
        self.thread.join(30)
        self.sock.close()
        return self.received


def test_finding4_a_fake_listener_on_loopback_gets_no_token(lab, lab_daemon, tmp_path):
    """A member pins the lab daemon's certificate and names a port a non-member listens on:
    over plain TCP or TLS with another certificate, the listener receives no byte of the token."""
    d, port, pin, where = lab_daemon()
    token = _secret(where.base / "a.token", MEMBER_TOKEN + "\n", lab["A"])
    cert, key = self_signed(tmp_path / "fake", "127.0.0.1")
    fake_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    fake_tls.load_cert_chain(cert, key)
    for context in (None, fake_tls):
        fake = _Recorder(context)
        out = _member_cli(lab["A"], "ls", "--host", f"127.0.0.1:{fake.port}", "--token-file", str(token),
                          "--fingerprint", pin)
        got = fake.done()
        assert out.returncode != 0, out.stdout
        assert MEMBER_TOKEN.encode() not in got and b"token" not in got, got[:200]
        if context is None:
            assert "no TLS connection" in out.stderr, out.stderr
        else:
            assert "another certificate" in out.stderr and "nothing was sent" in out.stderr, out.stderr
            assert got == b""  # the handshake ended it: not a byte of application data
    # without a pin the client refuses to send, even to loopback
    out = _member_cli(lab["A"], "ls", "--host", f"127.0.0.1:{port}", "--token-file", str(token))
    assert out.returncode != 0 and "before the daemon proves who it is" in out.stderr, out.stderr
    # the real daemon, pinned: A is A
    out = _member_cli(lab["A"], "ls", "--host", f"127.0.0.1:{port}", "--token-file", str(token), "--fingerprint", pin)
    assert out.returncode == 0, out.stderr


def test_finding5_a_taken_port_stops_serve_at_once_with_a_clear_error(tmp_path):
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    token = _secret(tmp_path / "t", OWNER_TOKEN)
    try:
        for option in (["--tcp", f"127.0.0.1:{port}", "--token-file", str(token)], ["--dashboard", f"127.0.0.1:{port}"]):
            state = tmp_path / f"s{len(option)}"
            started = time.monotonic()
            out = subprocess.run([*CLI, "serve", "--state-dir", str(state), "--gpus", "emulated:1xA100-40GB",
                                  *option], capture_output=True, text=True, timeout=120, check=False)
            assert out.returncode != 0, out.stderr
            assert f"error: port {port} is in use" in out.stderr and "pick another port" in out.stderr, out.stderr
            assert time.monotonic() - started < 60
            assert not (state / "collocate.sock").exists()  # nothing was left serving
    finally:
        taken.close()


def _authenticated(port: int, pin: str, token: str) -> ssl.SSLSocket:
    """A TLS connection that sent ``token`` and a ping, and keeps its slot open."""
    from collocate.common.tls import client_socket

    sock = client_socket(socket.create_connection(("127.0.0.1", port), timeout=30), pin=pin,
                         ca_file=None, host="127.0.0.1")
    sock.sendall(json.dumps({"token": token}).encode() + b"\n" + b'{"op":"ping","args":{}}\n')
    assert b'"ok":true' in sock.recv(65536)
    return sock


def test_finding6_one_token_cannot_hold_every_connection(lab, lab_daemon):
    """The owner's token holds its 3 connections (``--tcp-max-per-token 3``); a fourth is told
    it is busy (and audited), while A's token still gets through."""
    d, port, pin, where = lab_daemon("--tcp-max-per-token", "3")
    held = [_authenticated(port, pin, OWNER_TOKEN) for _ in range(3)]
    try:
        with pytest.raises(CollocateError, match="token already has 3 connections"):
            client = Client(d.state_dir, tcp=("127.0.0.1", port), token=OWNER_TOKEN, fingerprint=pin, timeout_s=5)
            with pytest.MonkeyPatch.context() as mp:  # no retries: see the refusal itself
                mp.setattr("collocate.client.connect.RETRY_FOR_S", 0.0)
                client.request("ping")
        member = Client(d.state_dir, tcp=("127.0.0.1", port), token=MEMBER_TOKEN, fingerprint=pin)
        assert member.request("ping")["pid"] == d.proc.pid
    finally:
        for s in held:
            s.close()
    events = [json.loads(line) for line in (d.state_dir / "audit.log").read_text().splitlines()]
    assert any(e["event"] == "busy" and "3 connections" in e["why"] and e["transport"] == "tcp" for e in events)
    # once they are closed, the owner gets through again
    assert Client(d.state_dir, tcp=("127.0.0.1", port), token=OWNER_TOKEN, fingerprint=pin).request("ping")


def test_token_files_others_can_read_are_refused(lab, tmp_path):
    loose = tmp_path / "t"
    loose.write_text(OWNER_TOKEN)
    loose.chmod(0o644)
    out = subprocess.run([*CLI, "serve", "--state-dir", str(tmp_path / "s"), "--gpus", "emulated:1xA100-40GB",
                          "--tcp", f"127.0.0.1:{_port()}", "--token-file", str(loose)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and f"chmod 600 {loose}" in out.stderr and "readable" in out.stderr, out.stderr
    where = LabDir()  # a folder the member can reach
    try:
        mine = where.work / "t"
        mine.write_text(MEMBER_TOKEN)
        os.chown(mine, lab["A"].uid, lab["A"].gid)
        mine.chmod(0o640)
        out = _member_cli(lab["A"], "ls", "--host", "127.0.0.1:9", "--token-file", str(mine),
                          "--fingerprint", "AB" * 32)
        assert out.returncode != 0 and f"chmod 600 {mine}" in out.stderr, out.stderr
    finally:
        where.close()


def test_the_audit_log_records_refusals_and_submits(lab, lab_daemon):
    d, port, pin, where = lab_daemon()
    with pytest.raises(CollocateError, match="wrong token"):
        Client(d.state_dir, tcp=("127.0.0.1", port), token="not-a-token-0123456789", fingerprint=pin).request("ls")
    owner = Client(d.state_dir, tcp=("127.0.0.1", port), token=OWNER_TOKEN, fingerprint=pin)
    job = owner.request("submit", argv=job_argv(60, 0.2), cwd=str(where.work), mem="1GiB")["id"]
    member = Client(d.state_dir, tcp=("127.0.0.1", port), token=MEMBER_TOKEN, fingerprint=pin)
    with pytest.raises(CollocateError, match="may not cancel"):
        member.request("cancel", id=job)
    with pytest.raises(CollocateError, match="only the daemon's owner"):
        member.request("drain")
    out = _member_cli(lab["E"], "ls", "--state-dir", str(d.state_dir))  # not in the group
    assert out.returncode != 0
    audit = d.state_dir / "audit.log"
    assert audit.stat().st_mode & 0o777 == 0o600 and audit.stat().st_uid == 0
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {"event": "submit", "user": "root", "transport": "tcp", "job": job}.items() <= next(
        e for e in events if e["event"] == "submit").items()
    assert any(e["event"] == "refused" and "wrong token" in e["why"] and e["address"].startswith("127.0.0.1:")
               for e in events)
    rights = [e for e in events if e["event"] == "rights"]
    assert {(e["user"], e["op"]) for e in rights} >= {(lab["A"].name, "cancel"), (lab["A"].name, "drain")}
    assert all(OWNER_TOKEN not in line and MEMBER_TOKEN not in line for line in audit.read_text().splitlines())
    d.client.request("cancel", id=job)


def test_the_audit_log_rotates_by_size(tmp_path):
    from collocate.daemon.audit import AuditLog

    log = AuditLog(tmp_path / "audit.log", max_bytes=2000, keep=2)
    for i in range(200):
        log.write("submit", user="alice", transport="unix", job=str(i))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.log", "audit.log.1", "audit.log.2"]
    assert all(p.stat().st_size <= 2100 for p in tmp_path.iterdir())
    last = json.loads((tmp_path / "audit.log").read_text().splitlines()[-1])
    assert last["job"] == "199"


def test_the_dashboard_has_a_token_of_its_own(lab_daemon):
    d, port, pin, where = lab_daemon("--dashboard", "127.0.0.1:0")
    kept = (d.state_dir / "dashboard.token").read_text().strip()
    assert kept and kept not in (OWNER_TOKEN, MEMBER_TOKEN)
    out = subprocess.run([*CLI, "dashboard-url", "--state-dir", str(d.state_dir)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith(f"?token={kept}"), out.stdout + out.stderr


def test_bad_fields_get_clean_errors_at_the_edge(lab_daemon):
    d, port, pin, where = lab_daemon()
    for op, args, words in (("history", {"points": "abc"}, "history points must be"),
                            ("submit", {"argv": ["true"], "cwd": str(where.work), "time": 1e-300},
                             "at least 1 s"),
                            ("submit", {"argv": ["true"], "cwd": str(where.work), "time": 0.5},
                             "at least 1 s"),
                            ("ls", {"after": [1]}, "ls after must be"),
                            ("logs", {"id": {"x": 1}}, "logs id must be")):
        with pytest.raises(CollocateError, match=words) as err:
            d.client.request(op, **args)
        assert "internal error" not in str(err.value)
    assert "Traceback" not in (d.state_dir / "daemon.log").read_text()


def test_serve_refuses_gpus_another_daemon_manages(daemons, tmp_path, monkeypatch):
    """Two daemons on one machine's (emulated) GPUs: the second refuses, naming the first's
    state dir; once the first is gone (even killed), its claim blocks nobody."""
    monkeypatch.setenv("COLLOCATE_GPU_REGISTRY", str(tmp_path / "registry"))
    first = daemons(name="first")
    out = subprocess.run([*CLI, "serve", "--state-dir", str(tmp_path / "second"), "--gpus", "emulated:2xA100-40GB"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and "already managed by another collocate daemon" in out.stderr, out.stderr
    assert str(first.state_dir) in out.stderr
    first.kill()
    second = daemons(name="second")
    assert second.client.request("ping")["gpus"] == 2


def test_a_member_without_the_profile_finds_the_lab_daemon(lab, lab_daemon):
    """``ssh host collocate ls`` (no /etc/profile.d): the lab's socket is tried first; with the
    lab daemon down, the hint says to ask the admin, never to start a daemon."""
    d, port, pin, where = lab_daemon()
    env = {"COLLOCATE_LAB_STATE_DIR": str(d.state_dir)}
    out = _member_cli(lab["A"], "ls", env=env)
    assert out.returncode == 0, out.stderr
    d.kill()
    wait_for(lambda: not (d.state_dir / "collocate.sock").exists() or d.proc.poll() is not None, 30, "the stop")
    (d.state_dir / "collocate.sock").unlink(missing_ok=True)  # a killed daemon leaves it
    out = _member_cli(lab["A"], "ls", env=env)
    assert out.returncode != 0
    assert "collocate serve" not in out.stderr and "systemctl status collocate-lab" in out.stderr, out.stderr
