"""Which NVML and GPM metrics work on this GPU (issue #6, item 1), through collocate's backend.

Reads the device through ``collocate.gpus.nvml.NvmlBackend`` (the daemon's backend) while idle,
then while a real training process (``collocate.bench.worker``) runs, then optionally under MPS
(``collocate.gpus.mps.MpsControl``), and records per metric whether NVML answered
(``capabilities()``), whether samples carried a value, and the idle vs loaded means, so a reader
sees that SM activity, occupancy, DRAM activity, power and energy really react to load and that
the worker's memory shows in the per-process list. Nothing here changes MIG settings or resets
the GPU; MPS is started in a private pipe directory and stopped again.

    python benchmarks/gpu/nvml_probe.py --out benchmarks/results      # on the GPU machine
    python benchmarks/gpu/nvml_probe.py --dry-run                     # CPU: a fake NVML

Writes ``nvml-probe-<device>-<date>.json`` and ``.md`` (device name, driver, CUDA and torch
versions, date in both). ``--dry-run`` runs the same code on a fake NVML (an H100 with GPM) and
no subprocess, so a typo cannot waste GPU time; its files say "dry run" and it writes nothing
unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from collocate.bench.envinfo import device_slug, environment
from collocate.bench.sampling import summarize
from collocate.gpus.base import DeviceSample
from collocate.gpus.nvml import NvmlBackend

FIELDS = ("used_mib", "gpu_util", "sm_activity", "sm_occupancy", "dram_activity", "power_watts",
          "energy_joules")
MIB = 1024 * 1024


class FakeNvml:
    """An H100 with GPM whose load rises after ``load()``: the dry run's stand-in for pynvml."""

    NVMLError = pynvml.NVMLError

    def __init__(self) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_ERROR_", "NVML_GPM_METRIC_", "NVML_DEVICE_MIG_")) or name in (
                    "NVML_SUCCESS", "NVML_GPM_METRICS_GET_VERSION"):
                setattr(self, name, getattr(pynvml, name))
        self.busy, self.energy_mj, self.step = 0.0, 1_000_000, 0

    def load(self, busy: float) -> None:
        self.busy = busy

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str: return "gpu0"
    def nvmlDeviceGetUUID(self, h: str) -> str: return "GPU-fake-h100"
    def nvmlDeviceGetName(self, h: str) -> str: return "NVIDIA H100 80GB HBM3 (fake, dry run)"
    def nvmlSystemGetDriverVersion(self) -> str: return "dry-run"
    def nvmlSystemGetCudaDriverVersion(self) -> int: return 0

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        return [0, 0]

    def nvmlDeviceGetAttributes(self, h: str) -> Any:
        return SimpleNamespace(multiprocessorCount=132)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        used = int((500 + 9000 * self.busy) * MIB)
        return SimpleNamespace(total=81_559 * MIB, used=used, free=81_559 * MIB - used)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=100 * self.busy, memory=30 * self.busy)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return int(70_000 + 500_000 * self.busy)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        self.energy_mj += int(35_000 + 250_000 * self.busy)
        return self.energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=9000 * MIB)] if self.busy else []

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: str) -> list[Any]:
        return []

    def nvmlDeviceGetProcessUtilization(self, h: str, ts: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> dict[str, int]: return {"step": -1}
    def nvmlGpmSampleFree(self, s: dict[str, int]) -> None: ...

    def nvmlGpmSampleGet(self, h: str, s: dict[str, int]) -> dict[str, int]:
        self.step += 1
        s["step"] = self.step
        return s

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        values = {pynvml.NVML_GPM_METRIC_SM_UTIL: 80 * self.busy,
                  pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 40 * self.busy,
                  pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 30 * self.busy}
        for i in range(request.numMetrics):
            m = request.metrics[i]
            m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, values[m.metricId]
        return request


def _sample_for(backend: NvmlBackend, uuid: str, seconds: float, period: float) -> list[DeviceSample]:
    out: list[DeviceSample] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out += [s for s in backend.sample() if s.uuid == uuid]
        time.sleep(period)
    return out


def _phase(samples: list[DeviceSample]) -> dict[str, Any]:
    """Per field: how many samples carried a value, and the phase's window summary."""
    present = {f: sum(getattr(s, f) is not None for s in samples) for f in FIELDS}
    return {"n": len(samples), "present": present, "summary": summarize(samples),
            "pids": sorted({p.pid for s in samples for p in s.processes})}


def _load(python: str, seconds: float, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A real training process: ResNet-50 at 224x224 for ``seconds``."""
    argv = [python, "-m", "collocate.bench.worker", "--workload", "resnet50-224",
            "--seconds", f"{seconds:g}", "--warmup", "2", "--device", "cuda"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _loaded_phase(backend: NvmlBackend, uuid: str, seconds: float, period: float,
                  env: dict[str, str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    proc = _load(sys.executable, seconds, env)
    # Sample until the worker exits and keep its last ``seconds``: its measured steps. A fixed
    # window from its start saw mostly the cold start (import, CUDA context, cuDNN autotuning;
    # 10+ s on the first H100 run) and read SM activity 0.005 for a job that keeps 0.8 busy.
    samples: list[DeviceSample] = []
    give_up = time.monotonic() + seconds + 120.0
    while proc.poll() is None and time.monotonic() < give_up:
        samples += _sample_for(backend, uuid, period, period)
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    if samples:
        samples = [x for x in samples if x.time >= samples[-1].time - seconds]
    status = {"exit_code": proc.returncode, "stderr_tail": (err or "")[-1500:]}
    return _phase(samples), status


def _mps_phase(backend: NvmlBackend, uuid: str, seconds: float, period: float) -> dict[str, Any]:
    """Start MPS privately, run the load as an MPS client, stop MPS; every error is recorded."""
    import os

    from collocate.common.errors import CollocateError
    from collocate.gpus.mps import MpsControl

    control = MpsControl(Path(tempfile.mkdtemp(prefix="probe-mps-")))
    try:
        control.start()
    except CollocateError as exc:
        return {"started": False, "error": str(exc)}
    try:
        env = {**os.environ, **control.client_env(), "CUDA_VISIBLE_DEVICES": uuid}
        phase, status = _loaded_phase(backend, uuid, seconds, period, env)
        return {"started": True, **phase, "worker": status}
    finally:
        try:
            control.stop()
        except CollocateError as exc:
            print(f"warning: {exc}", file=sys.stderr)


def probe(*, dry_run: bool, seconds: float, period: float, mps: bool, gpu: int) -> dict[str, Any]:
    fake = FakeNvml() if dry_run else None
    backend = NvmlBackend(node="probe", nvml=fake)
    try:
        device = backend.devices()[gpu]
        uuid = device.uuid
        doc: dict[str, Any] = {"dry_run": dry_run, "device": {
            "uuid": "(omitted)", "type": device.type_name, "total_mib": device.total_mib,
            "sm_count": device.sm_count, "mig_profile": device.mig_profile}}
        doc["idle"] = _phase(_sample_for(backend, uuid, min(3.0, seconds), period))
        if dry_run:
            fake.load(0.8)
            doc["loaded"] = _phase(_sample_for(backend, uuid, seconds, period))
            doc["worker"] = {"exit_code": None, "note": "dry run: no training process"}
            doc["mps"] = {"started": False, "note": "dry run: MPS not started"}
        else:
            doc["loaded"], doc["worker"] = _loaded_phase(backend, uuid, seconds, period, None)
            doc["mps"] = (_mps_phase(backend, uuid, seconds, period) if mps
                          else {"started": False, "note": "--no-mps"})
        doc["capabilities"] = backend.capabilities()
    finally:
        backend.close()
    idle, loaded = doc["idle"]["summary"], doc["loaded"]["summary"]
    doc["reacts_to_load"] = {
        f: (loaded[f] > idle[f]) if loaded.get(f) is not None and idle.get(f) is not None else None
        for f in ("sm_activity", "sm_occupancy", "dram_activity", "gpu_util", "power_watts")}
    doc["worker_memory_seen"] = bool(doc["loaded"]["pids"])
    return doc


def markdown(doc: dict[str, Any], env: dict[str, Any]) -> str:
    idle, loaded = doc["idle"]["summary"], doc["loaded"]["summary"]
    out = ["# NVML / GPM probe" + (" (DRY RUN on a fake NVML: not a measurement)"
                                   if doc["dry_run"] else ""), "",
           f"- device: {env.get('device_name')}, driver {env.get('driver')}, CUDA "
           f"{env.get('cuda')}, torch {env.get('torch')}, {env.get('date_utc')}", "",
           "| metric | NVML call | idle mean | loaded mean | reacts to load |",
           "|---|---|---:|---:|---|"]
    calls = {"sm_activity": "gpm", "sm_occupancy": "gpm", "dram_activity": "gpm",
             "gpu_util": "utilization", "power_watts": "power", "energy_joules": "energy"}
    caps = doc["capabilities"]
    for field, call in calls.items():
        def fmt(v: Any) -> str:
            return "n/a" if v is None else f"{v:.3g}"
        out.append(f"| {field} | {call}: {caps.get(call, 'not called')} | {fmt(idle.get(field))} "
                   f"| {fmt(loaded.get(field))} | {doc['reacts_to_load'].get(field, '-')} |")
    out += ["", "All NVML calls: " + ", ".join(f"{k}={v}" for k, v in sorted(caps.items())),
            "", f"Worker's memory in the per-process list: {doc['worker_memory_seen']}; "
            f"energy over the loaded phase: {loaded.get('energy_joules')} J "
            f"({loaded.get('energy_source')})", "",
            f"MPS: {json.dumps({k: v for k, v in doc['mps'].items() if k in ('started', 'error', 'note', 'pids')})}"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="fake NVML, no subprocess (CPU)")
    p.add_argument("--seconds", type=float, default=8.0, help="loaded phase length")
    p.add_argument("--period", type=float, default=0.5)
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--no-mps", action="store_true", help="skip the MPS phase")
    p.add_argument("--out", type=Path, help="folder for the JSON and markdown")
    args = p.parse_args(argv)
    if args.dry_run:
        args.seconds, args.period = min(args.seconds, 1.0), min(args.period, 0.1)
    doc = probe(dry_run=args.dry_run, seconds=args.seconds, period=args.period,
                mps=not args.no_mps, gpu=args.gpu)
    env = (environment("cuda", gpu_index=args.gpu) if not args.dry_run else
           {**environment("cpu"), "device_name": "fake H100 (dry run)", "measured_on": "dry-run"})
    doc["env"] = env
    text = markdown(doc, env)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"nvml-probe-{'dry-run' if args.dry_run else device_slug(env)}-{env['date_utc']}"
        (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        (args.out / f"{stem}.md").write_text(text)
        print(f"wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
