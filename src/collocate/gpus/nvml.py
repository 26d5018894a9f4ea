"""The real backend: NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

All NVML access in collocate goes through this module. The ``nvml`` object is injected (default:
the ``pynvml`` module) so tests pass a fake with the same function names instead of patching.

What we read, per schedulable device (a whole GPU, or each MIG instance when MIG mode is on;
MIG mode is only read, never changed): memory info, utilization rates (not on MIG), power and
total energy (whole GPUs), compute and MPS processes with their memory, per-process SM
utilization where the driver keeps it, and on GPUs where ``nvmlGpmQueryDeviceSupport`` says so
(Hopper and newer) the GPM metrics SM_UTIL, SM_OCCUPANCY and DRAM_BW_UTIL between two samples.
Every call that may be unsupported is wrapped: unsupported means None in the sample, and
``capabilities()`` records what worked so a GPU session can print it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from collocate.common.errors import CollocateError
from collocate.core.gputypes import GPU_TYPES, type_name_from_product
from collocate.core.model import GpuId
from collocate.gpus.base import DeviceInfo, DeviceSample, ProcessUsage
from collocate.gpus.mig_profiles import profile_from_device_name, profile_from_slices
from collocate.gpus.visible import Visible, select_devices

_MIB = 1024 * 1024
EMULATED_HINT = (
    "to run without GPUs use emulated ones: --gpus emulated:4xA100-40GB "
    "(or install the NVIDIA driver and check that `nvidia-smi` works)"
)


class NoGpuError(CollocateError):
    """No usable NVIDIA driver/GPU: the message says so and how to use emulated GPUs instead."""


def import_nvml() -> Any:
    """The ``pynvml`` module: the one place collocate imports NVML (untyped, hence ``Any``)."""
    import pynvml

    return pynvml


# -- pure helpers --------------------------------------------------------------------------

@overload
def bytes_to_mib(value: float) -> float: ...
@overload
def bytes_to_mib(value: None) -> None: ...
def bytes_to_mib(value: float | None) -> float | None:
    return None if value is None else value / _MIB


def milliwatts_to_watts(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def millijoules_to_joules(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def percent_to_fraction(value: float | None) -> float | None:
    return None if value is None else max(0.0, min(1.0, value / 100.0))


GPM_METRICS = {  # our field → pynvml constant name
    "sm_activity": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "dram_activity": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


def gpm_values(nvml: Any, metrics: Iterable[Any]) -> dict[str, float | None]:
    """Extract our fields from filled ``nvmlGpmMetric_t`` entries (percent → fraction).

    An entry whose ``nvmlReturn`` is not success gives None for that field.
    """
    wanted = {getattr(nvml, const): ours for ours, const in GPM_METRICS.items()}
    out: dict[str, float | None] = dict.fromkeys(GPM_METRICS)
    for m in metrics:
        ours = wanted.get(m.metricId)
        if ours is not None and m.nvmlReturn == nvml.NVML_SUCCESS:
            out[ours] = percent_to_fraction(m.value)
    return out


def merge_processes(
    compute: Iterable[Any] | None, mps: Iterable[Any] | None, sm_by_pid: dict[int, float]
) -> tuple[ProcessUsage, ...]:
    """One ``ProcessUsage`` per pid from NVML process lists (an MPS client may be in both)."""
    mem: dict[int, float] = {}
    for proc in [*(compute or ()), *(mps or ())]:
        used = bytes_to_mib(proc.usedGpuMemory) or 0.0  # None: not available (e.g. some MIG/WDDM)
        mem[int(proc.pid)] = max(mem.get(int(proc.pid), 0.0), used)
    return tuple(ProcessUsage(pid, mib, sm_by_pid.get(pid)) for pid, mib in sorted(mem.items()))


# -- the backend ---------------------------------------------------------------------------

@dataclass
class _Device:
    info: DeviceInfo
    handle: Any
    parent_handle: Any | None = None
    gpu_instance_id: int | None = None
    gpm_support: bool = False
    gpm_previous: Any | None = None
    gpm_spare: Any | None = None
    util_timestamp: int = 0

    @property
    def is_mig(self) -> bool:
        return self.info.parent_uuid is not None


class NvmlBackend:
    """Real GPUs of this machine as collocate devices. Raises ``NoGpuError`` without a driver.

    ``visible`` keeps only the GPUs a job scheduler gave us (``gpus/visible.py``); ``GpuId``
    indices stay NVML's, and jobs are given UUIDs, so they name the same GPU either way.
    """

    name = "nvml"
    emulated_state_dir: Path | None = None  # real GPUs: no emulated state for jobs to share
    needs_mps_server = True

    def __init__(self, *, node: str, nvml: Any = None, visible: Visible | None = None) -> None:
        if nvml is None:
            nvml = import_nvml()
        self.nvml, self.node = nvml, node
        self._status: dict[str, dict[str, str]] = {}  # metric → device uuid → state
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NoGpuError(f"no NVIDIA driver found: NVML could not start ({exc})",
                             hint=EMULATED_HINT) from exc
        except OSError as exc:
            raise NoGpuError(f"no NVIDIA driver found: {exc}", hint=EMULATED_HINT) from exc
        try:
            found = self._discover()
            allowed = {i.uuid for i in select_devices(visible, [d.info for d in found])}
            self._devices = [d for d in found if d.info.uuid in allowed]
        except BaseException as exc:
            self._shutdown()
            if not isinstance(exc, nvml.NVMLError):
                raise
            raise CollocateError(
                f"NVML failed while listing GPUs: {exc}",
                hint="check that `nvidia-smi` works; "
                "a GPU that fell off the bus needs a reset by an admin",
            ) from exc

    # -- GpuBackend ------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return [d.info for d in self._devices]

    def sample(self) -> list[DeviceSample]:
        return [self._sample(d) for d in self._devices]

    def close(self) -> None:
        for d in self._devices:
            for s in (d.gpm_previous, d.gpm_spare):
                if s is not None:
                    self._call("gpm", d.info.uuid, self.nvml.nvmlGpmSampleFree, s)
            d.gpm_previous = d.gpm_spare = None
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    def capabilities(self) -> dict[str, str]:
        """Per metric: "ok", "unsupported", or a mix/error naming the devices; for reports."""
        out: dict[str, str] = {}
        for metric, per_device in sorted(self._status.items()):
            states = set(per_device.values())
            if len(states) == 1:
                out[metric] = states.pop()
            else:
                out[metric] = "; ".join(f"{u}: {s}" for u, s in sorted(per_device.items()))
        return out

    # -- internals -------------------------------------------------------------------------

    def _minor(self, uuid: str, handle: Any) -> int | None:
        """N of /dev/nvidiaN (not always the NVML index): the device a job's cgroup allows."""
        get = getattr(self.nvml, "nvmlDeviceGetMinorNumber", None)
        minor = None if get is None else self._call("minor_number", uuid, get, handle)
        return None if minor is None else int(minor)

    def _call(self, metric: str, uuid: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; unsupported (or any NVML error) → None, and remember what happened."""
        try:
            value = fn(*args)
        except self.nvml.NVMLError as exc:
            self._record(metric, uuid, exc)
            return None
        self._record(metric, uuid, None)
        return value

    def _record(self, metric: str, uuid: str, exc: BaseException | str | None) -> None:
        n = self.nvml
        if exc is None:
            state = "ok"
        elif isinstance(exc, str):
            state = exc
        elif getattr(exc, "value", None) in (
            n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND
        ):
            state = "unsupported"
        else:
            state = f"error: {exc}"
        self._status.setdefault(metric, {})[uuid] = state

    def _discover(self) -> list[_Device]:
        n = self.nvml
        count = self._call("device_count", "-", n.nvmlDeviceGetCount)
        if not count:
            raise NoGpuError("NVML found no NVIDIA GPU on this machine", hint=EMULATED_HINT)
        out: list[_Device] = []
        for index in range(count):
            handle = n.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(n.nvmlDeviceGetUUID(handle))
            product = _text(n.nvmlDeviceGetName(handle))
            type_name = type_name_from_product(product)
            mode = self._call("mig_mode", uuid, n.nvmlDeviceGetMigMode, handle)
            if mode is not None and mode[0] == n.NVML_DEVICE_MIG_ENABLE:
                out += self._discover_mig(index, handle, uuid, type_name)
                continue
            mem = n.nvmlDeviceGetMemoryInfo(handle)
            attrs = self._call("attributes", uuid, n.nvmlDeviceGetAttributes, handle)
            known = GPU_TYPES.get(type_name)
            sms = int(attrs.multiprocessorCount) if attrs else (known.sm_count if known else 0)
            info = DeviceInfo(GpuId(self.node, index), uuid, type_name, mem.total / _MIB, sms,
                              minor=self._minor(uuid, handle))
            out.append(self._with_gpm(_Device(info, handle), handle))
        return out

    def _discover_mig(
        self, index: int, parent: Any, parent_uuid: str, type_name: str
    ) -> list[_Device]:
        n = self.nvml
        out: list[_Device] = []
        slots = self._call("mig_devices", parent_uuid, n.nvmlDeviceGetMaxMigDeviceCount, parent)
        slots = slots or 0
        for slot in range(slots):
            try:
                handle = n.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except n.NVMLError:
                continue  # NOT_FOUND: an empty slot
            uuid = _text(n.nvmlDeviceGetUUID(handle))
            gi = int(n.nvmlDeviceGetGpuInstanceId(handle))
            ci = int(n.nvmlDeviceGetComputeInstanceId(handle))
            mem = n.nvmlDeviceGetMemoryInfo(handle)
            attrs = self._call("attributes", uuid, n.nvmlDeviceGetAttributes, handle)
            profile = profile_from_device_name(_text(n.nvmlDeviceGetName(handle)))
            if profile is None and attrs is not None:
                profile = profile_from_slices(type_name, int(attrs.gpuInstanceSliceCount),
                                              float(attrs.memorySizeMB))
            info = DeviceInfo(GpuId(self.node, index, f"{gi}.{ci}"), uuid, type_name,
                              mem.total / _MIB, int(attrs.multiprocessorCount) if attrs else 0,
                              parent_uuid=parent_uuid, mig_profile=profile,
                              minor=self._minor(parent_uuid, parent))
            device = _Device(info, handle, parent_handle=parent, gpu_instance_id=gi)
            out.append(self._with_gpm(device, parent))
        return out

    def _with_gpm(self, device: _Device, gpu_handle: Any) -> _Device:
        uuid = device.info.uuid
        support = self._call("gpm", uuid, self.nvml.nvmlGpmQueryDeviceSupport, gpu_handle)
        device.gpm_support = bool(support is not None and support.isSupportedDevice)
        if support is not None and not device.gpm_support:
            self._record("gpm", device.info.uuid, "unsupported")
        return device

    def _sample(self, d: _Device) -> DeviceSample:
        n, uuid, h = self.nvml, d.info.uuid, d.handle
        now = time.time()
        mem = self._call("memory", uuid, n.nvmlDeviceGetMemoryInfo, h)
        util = power = energy = None
        thermal: dict[str, float | None] = dict.fromkeys(("temperature", "sm_clock", "mem_clock"))
        if d.is_mig:  # NVML keeps these per physical GPU only
            for metric in ("utilization", "power", "energy", "process_utilization", *thermal):
                self._record(metric, uuid, "not on MIG instances")
        else:
            util = self._call("utilization", uuid, n.nvmlDeviceGetUtilizationRates, h)
            power = self._call("power", uuid, n.nvmlDeviceGetPowerUsage, h)
            energy = self._call("energy", uuid, n.nvmlDeviceGetTotalEnergyConsumption, h)
            thermal = self._thermal(uuid, h)
        compute = self._call("processes", uuid, n.nvmlDeviceGetComputeRunningProcesses, h)
        mps = self._call("mps_processes", uuid, n.nvmlDeviceGetMPSComputeRunningProcesses, h)
        gpm = self._gpm(d)
        # Memory cannot be None in a sample; if NVML fails to read it, report the device as full
        # (nothing free) so no policy places a job on memory it cannot see.
        total = d.info.total_mib
        used = bytes_to_mib(mem.used) if mem is not None else total
        free = bytes_to_mib(mem.free) if mem is not None else 0.0
        return DeviceSample(
            uuid=uuid,
            time=now,
            used_mib=used,
            free_mib=free,
            gpu_util=percent_to_fraction(util.gpu) if util is not None else None,
            sm_activity=gpm["sm_activity"],
            sm_occupancy=gpm["sm_occupancy"],
            dram_activity=gpm["dram_activity"],
            power_watts=milliwatts_to_watts(power),
            energy_joules=millijoules_to_joules(energy),
            temperature_c=thermal["temperature"],
            sm_clock_mhz=thermal["sm_clock"],
            mem_clock_mhz=thermal["mem_clock"],
            processes=merge_processes(compute, mps, self._process_sm(d)),
        )

    def _thermal(self, uuid: str, h: Any) -> dict[str, float | None]:
        """Temperature (C) and the SM and memory clocks (MHz) as nvidia-smi shows them; None
        where the driver (or an older pynvml) does not give them."""
        n = self.nvml
        reads = {"temperature": ("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU", 0),
                 "sm_clock": ("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM", 1),
                 "mem_clock": ("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM", 2)}
        out: dict[str, float | None] = {}
        for metric, (fn_name, const, default) in reads.items():
            fn = getattr(n, fn_name, None)
            if fn is None:
                self._record(metric, uuid, "unsupported")
                out[metric] = None
                continue
            value = self._call(metric, uuid, fn, h, getattr(n, const, default))
            out[metric] = None if value is None else float(value)
        return out

    def _process_sm(self, d: _Device) -> dict[int, float]:
        """Per-process SM utilization since the last call (not kept by the driver on MIG)."""
        if d.is_mig:
            return {}
        n = self.nvml
        try:
            samples = n.nvmlDeviceGetProcessUtilization(d.handle, d.util_timestamp)
        except n.NVMLError as exc:
            # NOT_FOUND: no samples newer than the timestamp; SUCCESS: pynvml on an empty list
            if getattr(exc, "value", None) in (n.NVML_ERROR_NOT_FOUND, n.NVML_SUCCESS):
                return {}
            self._record("process_utilization", d.info.uuid, exc)
            return {}
        self._record("process_utilization", d.info.uuid, None)
        out: dict[int, float] = {}
        for s in samples:
            d.util_timestamp = max(d.util_timestamp, int(s.timeStamp))
            out[int(s.pid)] = percent_to_fraction(s.smUtil) or 0.0
        return out

    def _gpm(self, d: _Device) -> dict[str, float | None]:
        """GPM metrics between the previous sample of this device and a new one."""
        none: dict[str, float | None] = dict.fromkeys(GPM_METRICS)
        if not d.gpm_support:
            return none
        n, uuid = self.nvml, d.info.uuid
        sample = d.gpm_spare or self._call("gpm", uuid, n.nvmlGpmSampleAlloc)
        if sample is None:
            return none
        if d.is_mig:
            got = self._call(
                "gpm", uuid, n.nvmlGpmMigSampleGet, d.parent_handle, d.gpu_instance_id, sample
            )
        else:
            got = self._call("gpm", uuid, n.nvmlGpmSampleGet, d.handle, sample)
        if got is None:
            d.gpm_spare = sample
            return none
        previous, d.gpm_previous, d.gpm_spare = d.gpm_previous, sample, d.gpm_previous
        if previous is None:
            return none  # the first sample only starts the interval
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.sample1, request.sample2 = previous, sample
        ids = [getattr(n, const) for const in GPM_METRICS.values()]
        request.numMetrics = len(ids)
        for i, metric_id in enumerate(ids):
            request.metrics[i].metricId = metric_id
        filled = self._call("gpm", uuid, n.nvmlGpmMetricsGet, request)
        if filled is None:
            return none
        return gpm_values(n, filled.metrics[: len(ids)])


def driver_versions(index: int = 0, nvml: Any = None) -> dict[str, Any]:
    """Device name and driver/CUDA versions from NVML (``None`` where it cannot tell)."""
    out: dict[str, Any] = {"device_name": None, "driver": None, "cuda_driver": None}
    try:
        if nvml is None:
            nvml = import_nvml()
        nvml.nvmlInit()
    except Exception:
        return out
    try:
        out["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        version = int(nvml.nvmlSystemGetCudaDriverVersion())
        out["cuda_driver"] = f"{version // 1000}.{(version % 1000) // 10}"
        out["device_name"] = _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index)))
    except Exception:
        pass
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out


def nvml_available(nvml: Any = None) -> bool:
    """True when NVML loads and initialises (a driver is present); used by ``--gpus auto``."""
    if nvml is None:
        nvml = import_nvml()
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError):
        return False
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass
    return True


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

