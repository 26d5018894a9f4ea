"""Where a measurement ran: device name, driver, CUDA and torch versions, date.

Every file the harness writes carries this, because a number without its device and software is
not a result. On a CPU run ``measured_on`` is "cpu" and ``note`` says the numbers are not GPU
measurements.
"""

from __future__ import annotations

import datetime as dt
import platform
from typing import Any

from collocate.gpus.nvml import driver_versions

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
        env.update(driver_versions(gpu_index))
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
