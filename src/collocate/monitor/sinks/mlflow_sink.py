"""MLflow sink: one MLflow run per job, with its parameters, tags and system metrics over time.

Optional (``pip install 'collocate[mlflow]'``). By default it writes to a local SQLite tracking
store beside the daemon's state (``sqlite:///<state_dir>/mlflow.db``), so tracking works offline;
``tracking_uri`` points it at a server or any other store instead. View it with
``mlflow ui --backend-store-uri sqlite:///<state_dir>/mlflow.db``.

Per job: run name ``job-<id>[-<name>]``; params ``command``, ``gpus``, ``sharing``, ``policy``
(+ ``extra``); tags ``collocate.job_id``, ``collocate.user``, ``collocate.neighbours`` (every job
seen on the same GPUs while it ran, updated as neighbours come and go). Metrics, with prefix
``system/``: ``gpu_mem_mib``, ``sm_activity``, ``gpu_power_w`` (its attributed share),
``energy_wh`` and ``gpu_hours`` (cumulative), ``cpu_percent``, ``rss_mib``; the job's own
metrics (``log_metric``) keep their names and steps.

Why buffered and coarser: one ``log_batch`` per job per tick would cost dozens of SQLite
transactions every second (each ~tens of ms in MLflow's SQLAlchemy store). The sink records
system metrics every ``system_every_s`` (5 s; the monitoring store keeps every tick) and sends
one batch per job every ``flush_every_s`` (30 s), and at the job's end. Jobs' own metrics are
all kept. Use it behind ``GuardedSink`` (``SinkSet`` runs it in a worker thread, as its
``background`` attribute asks: creating the SQLite store alone takes seconds): ``write`` of a
tick it already buffered is a no-op, so retries after a failure do not duplicate points.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from collocate.common.errors import CollocateError
from collocate.monitor.sampler import Tick
from collocate.monitor.sinks.base import JobInfo

TAG_JOB = "collocate.job_id"
BATCH_LIMIT = 1000  # MLflow's log_batch maximum of metrics per call
_TERMINAL = {"done": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "rejected": "KILLED"}


def default_tracking_uri(state_dir: Path) -> str:
    return f"sqlite:///{os.fspath(Path(state_dir).absolute() / 'mlflow.db')}"


def _import_mlflow() -> Any:
    try:
        import mlflow  # noqa: F401
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise CollocateError(
            f"the MLflow sink needs MLflow ({exc})",
            hint="pip install 'collocate[mlflow]' (or run without --mlflow)",
        ) from exc
    return MlflowClient


class MlflowSink:
    name = "mlflow"
    background = True  # SinkSet delivers from a worker thread: MLflow calls can take seconds

    def __init__(self, tracking_uri: str, *, experiment: str = "collocate",
                 flush_every_s: float = 30.0, system_every_s: float = 5.0) -> None:
        client_cls = _import_mlflow()
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast; we retry
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        self.tracking_uri = tracking_uri
        self.client = client_cls(tracking_uri=tracking_uri)
        self.experiment = experiment
        self.flush_every_s = flush_every_s
        self.system_every_s = system_every_s
        self._last_system: dict[str, float] = {}
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}
        self._pending: dict[str, list[Any]] = {}
        self._neighbours: dict[str, set[str]] = {}
        self._tagged: dict[str, frozenset[str]] = {}
        self._energy_j: dict[str, float] = {}
        self._gpu_s: dict[str, float] = {}
        self._last_tick = float("-inf")
        self._last_flush = time.monotonic()

    # -- Sink ------------------------------------------------------------------------------
    def job_started(self, job: JobInfo) -> None:
        run_id = self._run(job.job_id, job)
        self._neighbours.setdefault(job.job_id, set()).update(job.neighbours)
        self._sync_tags(job.job_id, run_id)

    def write(self, tick: Tick) -> None:
        from mlflow.entities import Metric

        if tick.time > self._last_tick:  # a retried tick was already buffered
            self._last_tick = tick.time
            ms = int(tick.time * 1000)
            on_gpu: dict[str, set[str]] = {}
            for g in tick.gpus:
                for job_id in g.jobs:
                    on_gpu.setdefault(job_id, set()).update(g.jobs)
            for j in tick.jobs:
                self._neighbours.setdefault(j.job_id, set()).update(
                    on_gpu.get(j.job_id, set()) - {j.job_id})
                self._energy_j[j.job_id] = self._energy_j.get(j.job_id, 0.0) + (j.energy_j or 0.0)
                self._gpu_s[j.job_id] = self._gpu_s.get(j.job_id, 0.0) + j.gpu_time_s
                if tick.time - self._last_system.get(j.job_id, float("-inf")) < self.system_every_s:
                    continue  # the store keeps every tick; MLflow gets a coarser series
                self._last_system[j.job_id] = tick.time
                interval = max((g.interval_s for g in tick.gpus if g.uuid in
                                {s.uuid for s in j.gpus}), default=0.0)
                values = {
                    "system/gpu_mem_mib": j.gpu_mem_mib, "system/sm_activity": j.sm_activity,
                    "system/gpu_power_w": (j.energy_j / interval) if j.energy_j is not None
                    and interval > 0 else None,
                    "system/energy_wh": self._energy_j[j.job_id] / 3600.0,
                    "system/gpu_hours": self._gpu_s[j.job_id] / 3600.0,
                    "system/cpu_percent": j.cpu_percent, "system/rss_mib": j.rss_mib,
                }
                points = self._pending.setdefault(j.job_id, [])
                points += [Metric(k, float(v), ms, 0) for k, v in values.items() if v is not None]
            for m in tick.metrics:
                self._pending.setdefault(m.job_id, []).append(
                    Metric(m.key, m.value, int(m.time * 1000), m.step or 0))
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def job_ended(self, job_id: str, status: str) -> None:
        self.flush(only=job_id)
        run_id = self._runs.pop(job_id, None) or self._find_run(job_id)
        if run_id is not None:
            self.client.set_terminated(run_id, _TERMINAL.get(status, "FINISHED"))
        for state in (self._neighbours, self._tagged, self._energy_j, self._gpu_s,
                      self._last_system):
            state.pop(job_id, None)

    def close(self) -> None:
        self.flush()

    # -- internals -------------------------------------------------------------------------
    def flush(self, only: str | None = None) -> None:
        """Send buffered points, one batch per job; a failure keeps the unsent points."""
        for job_id in [only] if only is not None else list(self._pending):
            points = self._pending.get(job_id, [])
            run_id = self._run(job_id)
            self._sync_tags(job_id, run_id)
            while points:
                self.client.log_batch(run_id, metrics=points[:BATCH_LIMIT])
                del points[:BATCH_LIMIT]
            self._pending.pop(job_id, None)
        if only is None:
            self._last_flush = time.monotonic()

    def _sync_tags(self, job_id: str, run_id: str) -> None:
        neighbours = frozenset(self._neighbours.get(job_id, ()))
        if self._tagged.get(job_id) != neighbours:
            text = ",".join(sorted(neighbours, key=_k))
            self.client.set_tag(run_id, "collocate.neighbours", text)
            self._tagged[job_id] = neighbours

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            self._experiment_id = (found.experiment_id if found is not None
                                   else self.client.create_experiment(self.experiment))
        return self._experiment_id

    def _find_run(self, job_id: str) -> str | None:
        runs = self.client.search_runs([self._experiment()],
                                       filter_string=f"tags.`{TAG_JOB}` = '{job_id}'",
                                       max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0].info.run_id if runs else None

    def _run(self, job_id: str, job: JobInfo | None = None) -> str:
        """The job's run: cached, found by tag (after a daemon restart), or created."""
        if job_id in self._runs:
            return self._runs[job_id]
        from mlflow.entities import Param

        run_id = self._find_run(job_id)
        if run_id is None:
            job = job or JobInfo(job_id)
            tags = {TAG_JOB: job_id, "collocate.user": job.user,
                    "mlflow.runName": f"job-{job_id}" + (f"-{job.name}" if job.name else "")}
            run_id = self.client.create_run(self._experiment(), tags=tags).info.run_id
            params = {"command": " ".join(job.argv), "gpus": ",".join(job.gpus),
                      "sharing": job.sharing, "policy": job.policy, **job.extra}
            self.client.log_batch(run_id, params=[Param(k, str(v)[:6000])
                                                  for k, v in params.items() if v])
        self._runs[job_id] = run_id
        return run_id


def _k(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (1 << 62, job_id)
