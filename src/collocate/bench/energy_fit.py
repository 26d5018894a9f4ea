"""Fit the power curve's exponent to measured energy of whole runs, through the simulator.

The bench fits ``idle + (max - idle) * busy ** e`` to one-second power readings
(``fit.fit_power``); what a user reads from the simulator is energy over a trace, which also
depends on warm-up power, idle GPUs and how busy a shared GPU really is. So this fit takes the
real mini-trace runs (``collocate bench minitrace``: exclusive, and collocated under
time-slicing and MPS), simulates each as ``gpu-validation.md`` §5 row (f) does, and picks the
exponent whose simulated energies are closest to the measured ones (least squares on log
ratios, on a grid), with idle/max held at the GPU type's watts (``collocate/core/gputypes.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from collocate.core.gputypes import parse_cluster
from collocate.core.interference import default_interference
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy, policy_parameters
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import load_trace


#: How the mini-trace is replayed (docs/gpu-validation.md section 5, rows (c)-(f)): the daemon
#: of that run learned profiles only alone, so the policies are replayed blind.
@dataclass(frozen=True)
class Replay:
    trace: str = "trace-warmup.csv"
    cluster: str = "1xH100-80GB"
    startup_s: float = 10.0
    settle_s: float = 5.0
    profiles: str = "blind"


REPLAY = Replay()
#: Runs whose policy no longer places as it did then: `auto` waited settle_s after every
#: placement of a job whose memory was not measured; since first-run admission (issue 16) it
#: commits a known requirement at once, so the simulator cannot replay those runs' schedule.
NOT_REPLAYABLE = frozenset({"auto"})
GRID = tuple(round(1.0 + 0.05 * i, 2) for i in range(21))  # 1.00 .. 2.00


def measured_runs(folder: Path) -> list[dict]:
    """Policy, sharing and measured energy (kWh) of every run under ``folder/runs``."""
    runs = []
    for summary in sorted((folder / "runs").glob("*/summary.json")):
        doc = json.loads(summary.read_text())
        if doc.get("energy_kwh") and doc["policy"] not in NOT_REPLAYABLE:
            runs.append({"policy": doc["policy"], "sharing": doc["sharing"], "energy_kwh": doc["energy_kwh"]})
    return runs


def simulated_energy_kwh(folder: Path, policy: str, sharing: str, exponent: float) -> float:
    jobs = load_trace(folder / REPLAY.trace)
    model = replace(default_interference(), power_exponent=exponent)
    config = SimConfig(sharing=SharingMode(sharing), startup_s=REPLAY.startup_s, profiles=REPLAY.profiles,
                       interference=model)
    params = {"settle_s": REPLAY.settle_s} if "settle_s" in policy_parameters(policy) else {}
    result = Simulation(parse_cluster(REPLAY.cluster), jobs, make_policy(policy, **params), config).run()
    return result.energy_j / 3.6e6


def fit_exponent(folder: Path, grid=GRID) -> dict:
    """The grid exponent whose simulated energies best match the measured runs, and the errors."""
    runs = measured_runs(folder)
    if not runs:
        raise ValueError(f"no runs with measured energy under {folder / 'runs'}")
    table = np.array([[simulated_energy_kwh(folder, r["policy"], r["sharing"], e) for r in runs] for e in grid])
    measured = np.array([r["energy_kwh"] for r in runs])
    sse = (np.log(table / measured) ** 2).sum(axis=1)
    best = int(np.argmin(sse))
    return {"exponent": grid[best], "rms_log_error": math.sqrt(sse[best] / len(runs)),
            "runs": [{**r, "simulated_kwh": round(float(s), 6)} for r, s in zip(runs, table[best], strict=True)]}
