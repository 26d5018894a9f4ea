"""An in-memory ``DashboardSource`` whose GPUs are real emulated GPUs (tests only)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from collocate.common.errors import InputError
from collocate.daemon.views import device_readings, host_usage
from collocate.gpus.emulated import EmulatedBackend


class FakeSource:
    def __init__(self, backend: EmulatedBackend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.rows: list[dict[str, Any]] = []
        self.points: dict[str, deque[float]] = {}
        self.logs: dict[str, str] = {}
        self.errs: dict[str, str] = {}
        self.held: dict[str, float] = {}  # job id -> MiB it holds now (running jobs)
        self.draining = False
        self.submitted: list[list[str]] = []
        self.owner: dict[int, str] = {}  # pid -> job id, as the daemon knows its jobs' processes

    def add_job(self, name: str, state: str = "pending", on: tuple[str, ...] = (),
                user: str = "ann", mem_mib: float | None = 1000.0, reason: str = "",
                held_mib: float | None = None) -> str:
        with self.lock:
            job_id = str(len(self.rows) + 1)
            self.rows.append({"id": job_id, "name": name, "user": user, "state": state,
                              "on": list(on), "mem_mib": mem_mib, "submit_time": time.time(),
                              "start_time": time.time() if state != "pending" else None,
                              "end_time": time.time() if state not in ("pending", "running") else None,
                              "reason": reason, "argv": ["python", f"{name}.py"]})
            self.logs[job_id] = f"epoch 1 of {name}\n<b>not html</b>\n"
            self.errs[job_id] = f"warning from {name}\n"
            if held_mib is not None:
                self.held[job_id] = held_mib
            return job_id

    def gpus(self) -> list[dict[str, Any]]:
        samples = {s.uuid: s for s in self.backend.sample()}
        with self.lock:
            out = []
            for d in self.backend.devices():
                s = samples.get(d.uuid)
                hist = self.points.setdefault(d.uuid, deque(maxlen=60))
                if s is not None:
                    hist.append({"t": time.time(), "util": s.sm_activity,
                                 "used_mib": s.used_mib})
                here = [r["id"] for r in self.rows
                        if r["state"] == "running" and str(d.id) in r["on"]]
                out.append({"id": str(d.id), "uuid": d.uuid, "type": d.type_name,
                            "total_mib": d.total_mib, "used_mib": s.used_mib if s else None,
                            "util": s.sm_activity if s else None,
                            "jobs": here, "history": list(hist),
                            "job_mib": {j: self.held[j] for j in here if j in self.held},
                            **device_readings(s, self.owner)})
            return out

    def jobs(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{**r, "used_mib": self.held.get(r["id"])} for r in self.rows]

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            row = next((dict(r) for r in self.rows if r["id"] == job_id), None)
        if row is None:
            return None
        row["summary"] = {"peak_mib": 1234.0, "mean_sm": 0.42, "gpu_hours": 0.5, "energy_wh": 61.5}
        row["profile"] = {"sm_activity": 0.612, "dram_activity": 0.2,
                          "source": "measured alone in this attempt"}
        row["samples"] = [{"t": i, "gpu_mib": 100.0 * i, "sm": 0.4, "cpu_pct": 90.0}
                          for i in range(10)]
        row["attempts"] = [] if row["state"] == "pending" else [
            {"n": 1, "start": row["start_time"] - 60, "end": row["start_time"] - 30,
             "gpus": row["on"], "mem_mib": 900.0, "peak_mib": 1400.0, "outcome": "oom",
             "reason": "CUDA out of memory"},
            {"n": 2, "start": row["start_time"], "end": None, "gpus": row["on"],
             "mem_mib": 1800.0, "peak_mib": None, "outcome": None, "reason": None}]
        row["metrics"] = [{"t": i, "key": "loss", "value": 1.0 / (i + 1), "step": i}
                          for i in range(10)]
        return row

    def log_tail(self, job_id: str, max_bytes: int, stream: str = "stdout") -> str:
        return (self.errs if stream == "stderr" else self.logs).get(job_id, "")[-max_bytes:]

    def status(self) -> dict[str, Any]:
        return {"tracking": [{"sink": "mlflow", "degraded": True, "reason": "OSError: disk full"}],
                "daemon": {"draining": self.draining, "host": host_usage()}}

    def submit(self, argv: list[str], *, name: str | None, mem: str | None) -> str:
        self.submitted.append(list(argv))
        if argv[0] == "bad":
            raise InputError("bad command", hint="try another")
        return self.add_job(name or argv[0])
