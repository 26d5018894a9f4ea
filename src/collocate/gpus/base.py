"""The one interface every GPU backend implements.

The daemon and the monitor only talk to a ``GpuBackend``; tests and CPU-only machines swap in
the emulated backend instead of patching NVML calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from collocate.core.model import GpuId


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Static facts about one schedulable device (a whole GPU or one MIG instance)."""

    id: GpuId
    uuid: str  # what CUDA_VISIBLE_DEVICES gets (GPU-... or MIG-...)
    type_name: str  # e.g. "A100-40GB", or the NVML product name for unknown real GPUs
    total_mib: float
    sm_count: int
    parent_uuid: str | None = None  # the physical GPU of a MIG instance
    mig_profile: str | None = None  # e.g. "3g.20gb"
    #: N of the GPU's device file /dev/nvidiaN (its parent's for a MIG instance): what a job's
    #: cgroup denies for the GPUs it was not given (``collocate.node.cgroups``)
    minor: int | None = None

    @property
    def sm_fraction(self) -> float:
        """The instance's share of its GPU's SMs (1.0 for a whole GPU): the ``speed`` policies
        see (``collocate.gpus.mig_profiles.sm_fraction``, as the emulated backend and the
        simulator take it)."""
        if self.parent_uuid is None:
            return 1.0
        from collocate.gpus.mig_profiles import sm_fraction

        return sm_fraction(self.type_name, self.sm_count, self.mig_profile)


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    pid: int
    used_mib: float
    sm_util: float | None = None  # fraction in [0, 1], when the backend can attribute it


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One reading of a device. Metrics a backend cannot read are None, never a made-up zero."""

    uuid: str
    time: float  # time.time() of the reading
    used_mib: float
    free_mib: float
    gpu_util: float | None = None  # NVML "utilization.gpu" as a fraction
    sm_activity: float | None = None  # GPM SM_UTIL / DCGM SM_ACTIVE, fraction
    sm_occupancy: float | None = None
    dram_activity: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None  # monotonic counter since driver load
    processes: tuple[ProcessUsage, ...] = ()
    #: False when the device could not be read at all (its node of a cluster is away): the
    #: daemon then leaves it out of the policies' snapshot until it answers again.
    reachable: bool = True
    # what nvidia-smi shows beside (appended last: callers pass the fields above by position)
    temperature_c: float | None = None  # the GPU die, as nvidia-smi shows it
    sm_clock_mhz: float | None = None  # the SM (graphics) clock now
    mem_clock_mhz: float | None = None  # the memory clock now


class GpuBackend(Protocol):
    name: str
    #: Where jobs find emulated GPU state (the daemon exports it as ``COLLOCATE_EMULATED_DIR``);
    #: None for real GPUs.
    emulated_state_dir: Path | None
    #: Whether MPS sharing needs NVIDIA's MPS control daemon (real GPUs; emulated jobs model MPS
    #: themselves).
    needs_mps_server: bool

    def devices(self) -> list[DeviceInfo]:
        """Schedulable devices; with MIG enabled, the MIG instances instead of their parent."""
        ...

    def sample(self) -> list[DeviceSample]:
        """Read every device once. Must be cheap: the daemon calls it every sampling period."""
        ...

    def close(self) -> None: ...
