"""Where a measurement ran: device name, driver, CUDA and torch versions, date.

Every file the harness writes carries this, because a number without its device and software is
not a result. On a CPU run ``measured_on`` is "cpu" and ``note`` says the numbers are not GPU
measurements.
"""

from __future__ import annotations

import datetime as dt
import platform
from typing import Any

CPU_NOTE = "CPU run with tiny models: these numbers are NOT GPU measurements"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml_versions(index: int) -> dict[str, Any]:
    """Device name and driver/CUDA versions from NVML (``None`` where it cannot tell)."""
    out: dict[str, Any] = {"device_name": None, "driver": None, "cuda_driver": None}
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: versions stay unknown
        return out
    try:
        def text(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        out["driver"] = text(nvml.nvmlSystemGetDriverVersion())
        version = int(nvml.nvmlSystemGetCudaDriverVersion())
        out["cuda_driver"] = f"{version // 1000}.{(version % 1000) // 10}"
        out["device_name"] = text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index)))
    except Exception:  # noqa: BLE001 - partial answers are still worth keeping
        pass
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def environment(device: str, *, gpu_index: int = 0) -> dict[str, Any]:
    """The provenance block written into every result file."""
    try:
        import torch

        torch_version, torch_cuda = torch.__version__, torch.version.cuda
    except ImportError:
        torch_version = torch_cuda = None
    now = dt.datetime.now(dt.UTC)
    env: dict[str, Any] = {
        "measured_on": device,
        "torch": torch_version,
        "torch_cuda": torch_cuda,
        "python": platform.python_version(),
        "date_utc": now.date().isoformat(),
        "time_utc": now.isoformat(timespec="seconds"),
    }
    if device == "cuda":
        env.update(_nvml_versions(gpu_index))
        env["cuda"] = env.get("cuda_driver") or torch_cuda
    else:
        env.update(device_name=_cpu_name(), driver=None, cuda=None, note=CPU_NOTE)
    return env


def device_slug(env: dict[str, Any]) -> str:
    """Short name for folders: ``h100-80gb-hbm3`` from "NVIDIA H100 80GB HBM3", or ``cpu``."""
    if env.get("measured_on") != "cuda":
        return "cpu"
    name = str(env.get("device_name") or "gpu").lower().replace("nvidia", "").strip()
    return "-".join("".join(c if c.isalnum() else " " for c in name).split()) or "gpu"
