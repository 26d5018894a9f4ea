"""The memory fence of a job's processes, where the runtime allows (docs/daemon.md, "Fencing").

The daemon tells a fenced attempt the MiB it may hold on each of its GPUs in
``COLLOCATE_MEM_FENCE_MIB`` (``collocate.core.recovery.job_fence_mib``). The runner then puts
``fence_site`` first on the job's ``PYTHONPATH``: its ``sitecustomize`` (which chains to any
the job had) caps every PyTorch process's caching allocator there, at CUDA's own lazy
initialisation, so nothing starts CUDA earlier than the job would. Emulated jobs
(``collocate emulate-job``) read the same variable and refuse a claim past it as CUDA does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV_MEM_FENCE = "COLLOCATE_MEM_FENCE_MIB"


def site_dir() -> Path:
    """The directory whose ``sitecustomize`` fences a PyTorch job."""
    return Path(__file__).resolve().parent / "fence_site"


def with_fence_path(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``site_dir`` first on ``PYTHONPATH`` when the attempt is fenced (unchanged
    otherwise; a job's own ``PYTHONPATH`` entries stay after it)."""
    out = dict(env)
    if not env.get(ENV_MEM_FENCE):
        return out
    rest = env.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(site_dir()) + (os.pathsep + rest if rest else "")
    return out


def fence_of(env: Mapping[str, str]) -> float | None:
    """The fence in MiB ``env`` sets (None: none, or a value that is not a positive number)."""
    try:
        mib = float(env.get(ENV_MEM_FENCE, ""))
    except ValueError:
        return None
    return mib if mib > 0 else None
