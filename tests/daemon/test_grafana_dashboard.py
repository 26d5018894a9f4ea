"""The Grafana dashboard and Prometheus scrape configuration shipped in ``docs/grafana/``,
checked against a real daemon's ``/metrics`` on emulated GPUs (issue 37).

Every metric name a dashboard query uses is one the daemon exposes (with samples, except the
readings emulated GPUs do not give: temperature and clocks, which are declared and left
without samples, never zero); the scrape configuration asks for ``/metrics`` with the bearer
token the daemon requires (refused without it).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from daemon_harness import job_argv, wait_for
from test_e2e_monitoring import free_port, get

GRAFANA = Path(__file__).parents[2] / "docs" / "grafana"
NOT_ON_EMULATED = {"collocate_gpu_temperature_celsius", "collocate_gpu_sm_clock_hertz",
                   "collocate_gpu_memory_clock_hertz"}


def dashboard_metrics() -> set[str]:
    dash = json.loads((GRAFANA / "collocate-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    return {name for e in exprs for name in re.findall(r"\bcollocate_[a-z_]+\b", e)}


def exposed(text: str) -> tuple[set[str], set[str]]:
    """(names with at least one sample, names declared by a # TYPE line)."""
    sampled = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    counters = {line.split()[2] + "_total" for line in text.splitlines()
                if line.startswith("# TYPE ") and line.split()[3] == "counter"}
    return sampled, declared | counters


def test_every_dashboard_query_names_a_metric_the_daemon_exposes(daemons):
    port = free_port()
    d = daemons("--dashboard", f"127.0.0.1:{port}")
    token = (d.state_dir / "dashboard.token").read_text().strip()
    base = f"http://127.0.0.1:{port}"
    job = d.submit(job_argv(1500, 8.0, None, 0.4), mem="2GiB", name="scraped")
    d.submit(job_argv(100, 1.0), mem="1GiB", name="waits", hold=True)  # a pending job: why it waits
    d.wait_state(job, "running")

    def scrape() -> str | None:
        text = get(f"{base}/metrics", token)
        return text if "collocate_job_gpu_memory_bytes{" in text and f'job="{job}"' in text else None

    text = wait_for(scrape, 20, "the running job's series at /metrics")
    sampled, declared = exposed(text)
    wanted = dashboard_metrics()
    assert wanted - declared == set(), "the dashboard queries metrics the daemon never exposes"
    assert wanted - sampled == NOT_ON_EMULATED  # unread on emulated GPUs: absent, not zero

    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    scrape = config["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["authorization"]["type"] == "Bearer" and scrape["authorization"]["credentials_file"]
    try:
        urllib.request.urlopen(f"{base}/metrics", timeout=10)
        raise AssertionError("/metrics answered without the token")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401  # so the scrape needs the bearer token, as configured
