"""What every benchmark result records about where it ran."""

from __future__ import annotations

import datetime
import os
import platform


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "host_cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "device": "cpu",
        "date": datetime.date.today().isoformat(),
    }
