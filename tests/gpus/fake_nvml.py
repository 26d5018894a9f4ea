"""A fake of the pynvml functions collocate calls, for tests without a GPU.

It reuses pynvml's real error class and constants, so error codes behave as NVML's do; devices are
plain objects. GPU 0 is an H100 (GPM supported), GPU 1 an A100-40GB in MIG mode with a 3g and a
4g instance and empty slots, on which MPS process listing is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeDevice:
    uuid: str
    name: str
    total: int
    used: int
    sms: int
    mig: list[FakeDevice] = field(default_factory=list)
    gi: int = 0
    parent: FakeDevice | None = None
    gpm: bool = False
    power_mw: int = 250_000
    energy_mj: int = 1_000_000
    procs: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, *, fail_init: int | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_ERROR_", "NVML_GPM_METRIC_", "NVML_DEVICE_MIG_")) or name in (
                "NVML_SUCCESS", "NVML_GPM_METRICS_GET_VERSION", "NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM",
                "NVML_CLOCK_MEM"
            ):
                setattr(self, name, getattr(pynvml, name))
        self.fail_init = fail_init
        self.calls: list[str] = []
        h100 = FakeDevice("GPU-h100", "NVIDIA H100 80GB HBM3", 81_559 * MIB, 1000 * MIB, 132, gpm=True,
                          procs=[(111, 600 * MIB), (222, None)])
        a100 = FakeDevice("GPU-a100", "NVIDIA A100-SXM4-40GB", 40_536 * MIB, 0, 108)
        a100.mig = [
            FakeDevice("MIG-aaa", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19_968 * MIB, 10 * MIB, 42, gi=2,
                       parent=a100, procs=[(333, 5 * MIB)]),
            FakeDevice("MIG-bbb", "NVIDIA A100-SXM4-40GB MIG 4g.20gb", 19_968 * MIB, 0, 56, gi=1,
                       parent=a100),
        ]
        self.gpus = [h100, a100]
        self.gpm_step = 0

    def _err(self, code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    # lifecycle
    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.fail_init is not None:
            raise self._err(self.fail_init)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    # discovery
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeDevice) -> bytes:
        return h.name.encode()  # older bindings return bytes

    def nvmlDeviceGetMigMode(self, h: FakeDevice) -> list[int]:
        if h.gpm:  # pretend this H100 predates MIG support in the driver
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1] if h.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeDevice) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeDevice, i: int) -> FakeDevice:
        if i >= len(h.mig):
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return h.mig[i]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeDevice) -> int:
        return h.gi

    def nvmlDeviceGetComputeInstanceId(self, h: FakeDevice) -> int:
        return 0

    def nvmlDeviceGetAttributes(self, h: FakeDevice) -> SimpleNamespace:
        return SimpleNamespace(multiprocessorCount=h.sms, gpuInstanceSliceCount=3, memorySizeMB=h.total // MIB)

    # readings
    def nvmlDeviceGetMemoryInfo(self, h: FakeDevice) -> SimpleNamespace:
        return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeDevice) -> SimpleNamespace:
        if h.mig or h.parent:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=87, memory=30)

    def nvmlDeviceGetPowerUsage(self, h: FakeDevice) -> int:
        return h.power_mw

    def nvmlDeviceGetTemperature(self, h: FakeDevice, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 61

    def nvmlDeviceGetClockInfo(self, h: FakeDevice, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeDevice) -> int:
        h.energy_mj += 5000
        return h.energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeDevice) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.procs]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: FakeDevice) -> list[SimpleNamespace]:
        if h.parent is not None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=222, usedGpuMemory=300 * MIB)] if h.gpm else []

    def nvmlDeviceGetProcessUtilization(self, h: FakeDevice, ts: int) -> list[SimpleNamespace]:
        self.calls.append(f"procutil:{h.uuid}:{ts}")
        if not h.gpm:
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=111, timeStamp=ts + 10, smUtil=40, memUtil=5)]

    # GPM
    def nvmlGpmQueryDeviceSupport(self, h: FakeDevice) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=1 if h.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> dict[str, int]:
        return {"step": -1}

    def nvmlGpmSampleFree(self, s: dict[str, int]) -> None:
        self.calls.append("gpm_free")

    def nvmlGpmSampleGet(self, h: FakeDevice, s: dict[str, int]) -> dict[str, int]:
        self.gpm_step += 1
        s["step"] = self.gpm_step
        return s

    def nvmlGpmMigSampleGet(self, h: FakeDevice, gi: int, s: dict[str, int]) -> dict[str, int]:
        raise AssertionError("GPM is not supported on the fake A100")

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert request.sample2["step"] == request.sample1["step"] + 1
        values = {pynvml.NVML_GPM_METRIC_SM_UTIL: 62.5, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 31.0}
        for m in request.metrics[: request.numMetrics]:
            if m.metricId in values:
                m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, values[m.metricId]
            else:
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED  # DRAM_BW_UTIL missing here
        return request
