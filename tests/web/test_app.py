"""The dashboard API over a fake source with real emulated GPUs: routes, token, metrics."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx")

from fastapi.testclient import TestClient

from collocate.common.errors import CollocateError
from collocate.gpus.emulated import EmulatedBackend
from collocate.monitor.sinks.prometheus import PrometheusSink
from collocate.web.app import cookie_name, create_app
from collocate.web.server import is_loopback, serve_in_thread

from .fake_source import FakeSource

TOKEN = "0123456789abcdef0123"
LOCAL = "http://127.0.0.1:8765"  # a token-less dashboard answers loopback Host names only


def local(app) -> TestClient:
    return TestClient(app, base_url=LOCAL)


@pytest.fixture
def source(tmp_path) -> FakeSource:
    return FakeSource(EmulatedBackend.create(tmp_path / "emu", "2xA100-40GB", node="web"))


def test_api_routes(source):
    source.add_job("resnet", state="running", on=("web:0",))
    client = local(create_app(source))
    gpus = client.get("/api/gpus").json()
    assert [g["id"] for g in gpus] == ["web:0", "web:1"] and gpus[0]["jobs"] == ["1"]
    assert gpus[0]["total_mib"] == 40_536
    assert client.get("/api/jobs").json()[0]["name"] == "resnet"
    assert client.get("/api/jobs/1").json()["summary"]["energy_wh"] == 61.5
    assert "epoch 1" in client.get("/api/jobs/1/log").json()["text"]
    assert client.get("/api/jobs/9").status_code == 404
    assert client.get("/api/jobs/9/log").status_code == 404
    status = client.get("/api/status").json()
    assert status["can_submit"] and status["tracking"][0]["degraded"]
    page = client.get("/")
    assert page.status_code == 200 and 'id="gpus"' in page.text and "http" not in page.text.split(
        "<script>")[1].replace("http://www.w3.org/2000/svg", "")  # no CDN, no remote fetch
    assert client.get("/metrics").status_code == 404  # no registry given
    assert client.get("/jobs/1").text == page.text  # a job's linkable page is the same page
    assert client.get("/api/jobs/1/log", params={"stream": "stderr"}).json() == {
        "id": "1", "stream": "stderr", "text": "warning from resnet\n"}
    assert client.get("/api/jobs/1/log", params={"stream": "x"}).status_code == 422


def test_submit_passthrough_validates(source):
    client = local(create_app(source))
    assert client.post("/api/jobs", json={"argv": ["python", "a.py"], "name": "a"}).json() == {
        "id": "1"}
    assert client.post("/api/jobs", json={"argv": []}).status_code == 422
    refused = client.post("/api/jobs", json={"argv": ["bad"]})
    assert refused.status_code == 422 and "try another" in refused.json()["detail"]


def test_submit_splits_the_command_as_a_shell_would(source):
    client = local(create_app(source))
    ok = client.post("/api/jobs", json={"command": """python a.py --tag 'run one' --msg "a b" x\\ y"""})
    assert ok.status_code == 200
    assert source.submitted[-1] == ["python", "a.py", "--tag", "run one", "--msg", "a b", "x y"]
    unbalanced = client.post("/api/jobs", json={"command": "python a.py --tag 'run one"})
    assert unbalanced.status_code == 422
    assert "no closing quotation" in unbalanced.json()["detail"]
    assert len(source.submitted) == 1  # nothing queued
    assert client.post("/api/jobs", json={"command": "   "}).status_code == 422


def test_read_only_source_refuses_submit(source):
    class ReadOnly:
        gpus, jobs, job = source.gpus, source.jobs, source.job
        log_tail, status = source.log_tail, source.status

    client = local(create_app(ReadOnly()))
    assert client.post("/api/jobs", json={"argv": ["x"]}).status_code == 501
    assert client.get("/api/status").json()["can_submit"] is False


def test_token_is_required_when_set(source):
    client = TestClient(create_app(source, token=TOKEN))
    assert client.get("/api/gpus").status_code == 401
    assert client.get("/").status_code == 401
    assert client.get("/metrics").status_code == 401
    assert client.get("/", params={"token": "wrong-wrong-wrong"}).status_code == 401
    assert client.get("/api/jobs", headers={"Authorization": "Bearer wrong-wrong-wrong"}).status_code == 401
    assert client.get("/api/jobs", headers={"X-Collocate-Token": TOKEN[:-1]}).status_code == 401
    assert client.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get("/api/jobs", headers={"X-Collocate-Token": TOKEN}).status_code == 200
    assert not client.cookies  # headers authenticate one request; only the URL token sets a cookie
    with pytest.raises(CollocateError, match="too short"):
        create_app(source, token="short")


def test_the_url_token_once_then_a_cookie(source):
    client = TestClient(create_app(source, token=TOKEN))
    first = client.get("/", params={"token": TOKEN})
    assert first.status_code == 200
    set_cookie = first.headers["set-cookie"]
    assert set_cookie.startswith(cookie_name(TOKEN) + "=")
    assert "httponly" in set_cookie.lower() and "samesite=strict" in set_cookie.lower()
    assert client.get("/api/gpus").status_code == 200  # the cookie carries it now
    client.cookies.set(cookie_name(TOKEN), "wrong-wrong-wrong")
    assert client.get("/api/gpus").status_code == 401
    other = create_app(source, token=TOKEN[::-1])  # another daemon's dashboard on the same host
    assert cookie_name(TOKEN) != cookie_name(TOKEN[::-1])
    assert TestClient(other, cookies={cookie_name(TOKEN): TOKEN}).get("/api/gpus").status_code == 401


def test_without_a_token_only_loopback_host_names_are_answered(source):
    app = create_app(source)
    for base in (LOCAL, "http://localhost:8765", "http://[::1]:8765"):
        assert TestClient(app, base_url=base).get("/api/gpus").status_code == 200, base
    for base in ("http://evil.example:8765", "http://testserver", "http://10.0.0.5:8765"):
        assert TestClient(app, base_url=base).get("/api/gpus").status_code == 403, base  # rebinding


def test_metrics_endpoint_serves_the_registry_and_queue_metrics(source):
    from prometheus_client.parser import text_string_to_metric_families

    for name, state, attempts, ooms, wait in [("a", "pending", 0, 0, "memory"),
                                              ("b", "pending", 1, 1, "memory"),
                                              ("c", "pending", 0, 0, None),
                                              ("d", "running", 2, 1, None),
                                              ("e", "done", 3, 2, None), ("f", "done", 1, 0, None),
                                              ("g", "failed", 4, 4, None)]:
        source.add_job(name, state=state)
        source.rows[-1].update(attempts=attempts, oom_crashes=ooms, wait=wait)
    sink = PrometheusSink(queue=source.jobs)
    client = local(create_app(source, registry=sink.registry))
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "# TYPE collocate_gpu_memory_used_bytes gauge" in r.text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(r.text) for s in f.samples}
    jobs = {dict(k[1])["state"]: v for k, v in samples.items() if k[0] == "collocate_jobs"}
    assert jobs == {"pending": 3, "running": 1, "done": 2, "failed": 1, "cancelled": 0,
                    "rejected": 0, "timeout": 0}
    assert samples["collocate_jobs_waiting", (("wait", "memory"),)] == 2
    assert samples["collocate_jobs_waiting", (("wait", "queue"),)] == 1  # no kind given
    assert samples["collocate_oom_crashes_total", ()] == 8
    assert samples["collocate_oom_recoveries_total", ()] == 1  # e: done after OOMs
    assert samples["collocate_placements_total", ()] == 11
    assert "collocate_jobs" not in local(create_app(
        source, registry=PrometheusSink().registry)).get("/metrics").text  # no queue given


def test_serve_in_thread_local_only_without_token_and_stops(source):
    import httpx

    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    with pytest.raises(CollocateError, match="without a token"):
        serve_in_thread(create_app(source), "0.0.0.0", 0)
    server = serve_in_thread(create_app(source), "127.0.0.1", 0)
    try:
        assert httpx.get(server.url + "api/gpus", timeout=10).status_code == 200
    finally:
        server.stop()
    assert not server.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url, timeout=2)


def test_board_pages_finished_jobs_counts_every_state_and_keeps_unknown_ones_active():
    from collocate.web.app import board

    rows = [{"id": str(i), "user": "ann" if i % 2 else "bob", "name": f"j{i}", "state": state,
             "end_time": float(i) if state in ("done", "timeout", "cancelled") else None}
            for i, state in enumerate(["pending", "running", "suspended", *["done"] * 20,
                                       "timeout", "cancelled"], start=1)]
    b = board(rows, page=0, per_page=10)
    assert [r["state"] for r in b["active"]] == ["pending", "running", "suspended"]  # a newer state
    assert b["counts"]["suspended"] == 1 and b["counts"]["failed"] == 0 and b["counts"]["timeout"] == 1
    assert b["finished_total"] == 22 and b["pages"] == 3
    assert [r["id"] for r in b["finished"]][:2] == ["25", "24"]  # newest first
    last = board(rows, page=99, per_page=10)
    assert last["page"] == 2 and len(last["finished"]) == 2
    only = board(rows, user="bob", state="done")
    assert only["finished_total"] == 10 and all(r["user"] == "bob" for r in only["finished"])
    assert only["counts"]["done"] == 20  # counts are over every job, filters aside
