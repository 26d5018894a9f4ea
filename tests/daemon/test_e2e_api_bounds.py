"""The API under hostile or crowded clients (issue 19, findings 4, 10, 11), with real sockets."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from pathlib import Path

import psutil
import pytest
from daemon_harness import job_argv, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collocate.client.connect import Client
from collocate.common.errors import CollocateError
from collocate.common.tls import cert_fingerprint
from collocate.daemon.server import ApiServer
from collocate.wire.rights import RIGHTS
from collocate.wire.schema import FIELDS

TOKEN = "a-long-random-test-token-0123456789"


def _tcp_daemon(daemons, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    d = daemons("--tcp", f"127.0.0.1:{port}", "--token-file", str(token_file))
    return d, port, cert_fingerprint(d.state_dir / "tls" / "cert.pem")


def tls_peer(port: int) -> ssl.SSLSocket:
    """A raw TLS connection to the daemon's TCP API (no pin: a stranger's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30))


def _reply(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    try:
        return sock.makefile("rb").readline()
    except OSError:
        return b""


def test_unauthenticated_tcp_peers_cannot_grow_the_daemon(daemons, tmp_path):
    """Big lines before the token are cut at 4 KiB; 200 such peers cost the daemon little."""
    d, port, pin = _tcp_daemon(daemons, tmp_path)
    rss_before = psutil.Process(d.proc.pid).memory_info().rss
    junk = b"x" * (1 << 20)  # 1 MiB, no newline
    replies = []
    for _ in range(4):  # 4 waves of 50 (the TCP listener serves at most 64 at once)
        socks = [tls_peer(port) for _ in range(50)]
        for s in socks:
            try:
                s.sendall(junk)
            except OSError:
                pass  # the daemon hung up after 4 KiB: what we want
        replies += [_reply(s) for s in socks]
        for s in socks:
            s.close()
    grown_mib = (psutil.Process(d.proc.pid).memory_info().rss - rss_before) / 2**20
    assert grown_mib < 64, grown_mib  # it read ~4 KiB of each 1 MiB line, not the line
    assert any(b"too long" in r for r in replies)
    good = Client(d.state_dir, tcp=("127.0.0.1", port), token=TOKEN, fingerprint=pin)
    assert good.request("ping")["pid"] == d.proc.pid
    with pytest.raises(CollocateError, match="token"):
        Client(d.state_dir, tcp=("127.0.0.1", port), token="wrong-token-wrong-token-wrong",
               fingerprint=pin).request("ls")


def test_silent_tcp_peers_cannot_keep_a_token_holder_out(daemons, tmp_path):
    """64 silent peers fill the pool of peers without a token: a client with the token gets
    through at once (the oldest silent peer makes room), not after they time out."""
    d, port, pin = _tcp_daemon(daemons, tmp_path)
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]
    try:
        wait_for(lambda: len([c for c in psutil.Process(d.proc.pid).net_connections("tcp")
                              if c.status == psutil.CONN_ESTABLISHED]) >= 64, 30, "the daemon to accept them")
        good = Client(d.state_dir, tcp=("127.0.0.1", port), token=TOKEN, fingerprint=pin)
        started = time.monotonic()
        assert good.request("ping")["pid"] == d.proc.pid
        assert time.monotonic() - started < 5
    finally:
        for s in silent:
            s.close()


def test_idle_unix_connections_are_closed(tmp_path):
    server = ApiServer(tmp_path / "api.sock", lambda op, args, peer: "pong", idle_timeout_s=0.5)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(tmp_path / "api.sock"))
            s.settimeout(30)
            assert s.recv(1) == b""  # closed by the daemon, not by our timeout
    finally:
        server.stop()


def test_300_clients_at_once_all_get_answers(daemons):
    d = daemons()
    results: list[object] = []

    def ask() -> None:
        try:
            results.append(Client(d.state_dir, timeout_s=60).request("ls"))
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            results.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors and len(results) == 300, errors[:3]


def test_a_repeated_submit_key_gives_the_stored_job(daemons, tmp_path):
    d = daemons()
    args = dict(argv=job_argv(300, 0.2), cwd=str(tmp_path), mem="1GiB", key="retry-key-0001")
    first = d.client.request("submit", **args)
    again = d.client.request("submit", **args)
    assert again["id"] == first["id"]
    assert [r["id"] for r in d.client.request("ls", all=True)] == [first["id"]]
    d.kill()
    d.start()  # the key is in SQLite, not only in memory
    assert d.client.request("submit", **args)["id"] == first["id"]
    assert d.client.request("submit", **{**args, "key": "another-key-0002"})["id"] != first["id"]


def test_bad_logs_arguments_and_deep_json_get_clear_errors(daemons, tmp_path):
    d = daemons()
    job = d.submit(job_argv(300, 0.2), mem="1GiB")
    d.wait_state(job, "done")
    for bad, what in (({"offset": -1}, "offset"), ({"offset": "abc"}, "offset"),
                      ({"attempt": 0}, "attempt"), ({"attempt": "x"}, "attempt"),
                      ({"offset": 1.5}, "offset")):
        with pytest.raises(CollocateError, match=f"logs {what} must be") as err:
            d.client.request("logs", id=job, **bad)
        assert "internal error" not in str(err.value)
    deep = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(d.state_dir / "collocate.sock"))
        s.sendall(deep)
        reply = json.loads(_reply(s))
    assert not reply["ok"] and "nested too deeply" in reply["error"]
    assert d.client.request("ping")["pid"] == d.proc.pid
    log = d.read_log() + Path(d.state_dir / "daemon.log").read_text()
    assert "RecursionError" not in log and "Traceback" not in log




_LEAF = (st.none() | st.booleans() | st.integers(-(10**18), 10**18) | st.sampled_from(["1", "2", 1, 2, ""])
         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
_JSON = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
_RAW_NUMBERS = ("1e400", "-1e400", "1e-300", "NaN", "Infinity", "-0.0", "9" * 30)


def _request(op: str) -> st.SearchStrategy[bytes]:
    """One request line for ``op``: mostly its own fields (random JSON in them), sometimes a
    field it does not have, a number JSON allows but Python reads oddly, or a stray key."""
    known = sorted(FIELDS.get(op, {})) or ["id"]
    names = st.sampled_from(known) | st.text(min_size=1, max_size=12)
    args = st.dictionaries(names, _JSON, max_size=4)

    def line(case: tuple[dict, str | None, bool]) -> bytes:
        fields, raw, stray = case
        if op == "submit":  # whatever else it says, it runs nothing: /bin/true, held, drained
            fields = {**fields, "argv": ["/bin/true"], "hold": True}
        message: dict = {"op": op, "args": fields}
        if stray:
            message["stray"] = 1
        text = json.dumps(message)
        if raw is not None and fields:  # the first field's value as a raw JSON number
            first = json.dumps(next(iter(fields)))
            text = text.replace(f"{first}: {json.dumps(fields[next(iter(fields))])}", f"{first}: {raw}", 1)
        return text.encode()

    return st.tuples(args, st.none() | st.sampled_from(_RAW_NUMBERS), st.booleans()).map(line)


def test_random_requests_over_the_socket_get_an_answer_never_an_internal_error(daemons, tmp_path):
    """Random JSON at every op (and ops that do not exist) over the daemon's real Unix socket,
    a connection each: every reply is ``ok`` or a clean error (never ``internal error``), an
    unknown field is named with the op's known ones, and the daemon is up throughout and
    after. Drained, so nothing submitted runs; two held jobs give the ids something to find."""
    d = daemons()
    d.client.request("drain")
    for _ in range(2):
        d.client.request("submit", argv=["/bin/true"], cwd=str(tmp_path), hold=True)
    ops = sorted(op for op in RIGHTS if op not in ("resume", "drain"))
    assert set(FIELDS) == set(RIGHTS)  # every op the daemon answers has its row
    sock = str(d.state_dir / "collocate.sock")
    answers: dict[str, int] = {"ok": 0, "error": 0}

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from([*ops, "format-disk", ""]).flatmap(_request))
    def check(line: bytes) -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sock)
            s.sendall(line + b"\n")
            reply = json.loads(_reply(s))
        assert reply["ok"] or ("internal error" not in reply["error"] and reply["error"]), (line, reply)
        answers["ok" if reply["ok"] else "error"] += 1
        message = json.loads(line, parse_constant=lambda c: None)
        unknown = set(message["args"]) - set(FIELDS.get(message["op"], {}))
        if message["op"] in FIELDS and unknown:
            assert not reply["ok"], (line, reply)  # refused, by name (the test below) or sooner

    check()
    assert answers["ok"] and answers["error"], answers  # both kinds came back
    assert d.proc.poll() is None and d.client.request("ping")["pid"] == d.proc.pid
    log = (d.state_dir / "daemon.log").read_text()
    assert "Traceback" not in log and "internal error" not in log


def test_unknown_fields_are_refused_with_the_known_ones(daemons, tmp_path):
    """A misspelt field is an error naming it and what the op knows, never silently dropped;
    a number JSON allows but no field can take (``1e400`` reads as infinity) is refused."""
    d = daemons()
    with pytest.raises(CollocateError, match=r'unknown field "foo" in submit; known: after, after_any') as err:
        d.client.request("submit", argv=["/bin/true"], cwd=str(tmp_path), foo=1)
    assert "hold" in str(err.value) and "upgrade" in (err.value.hint or "")
    with pytest.raises(CollocateError, match='unknown field "ids" in cancel; known: id'):
        d.client.request("cancel", ids=["1"])
    with pytest.raises(CollocateError, match='unknown field "x" in ping; known: none'):
        d.client.request("ping", x=1)
    assert d.client.request("ls", all=True) == []
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(d.state_dir / "collocate.sock"))
        s.sendall(b'{"op": "history", "args": {"since_s": 1e400}}\n')
        reply = json.loads(_reply(s))
    assert not reply["ok"] and "too large" in reply["error"], reply
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(d.state_dir / "collocate.sock"))
        s.sendall(b'{"op": "ping", "args": {}, "token": "x"}\n')
        reply = json.loads(_reply(s))
    assert not reply["ok"] and 'unknown field "token" in the request' in reply["error"], reply
