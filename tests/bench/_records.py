"""Synthetic bench records generated from *known* model parameters, to test the fitting code.

These are test inputs, not measurements: ``env`` says ``measured_on = "synthetic"``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from collocate.bench.fit import Observation, predict
from collocate.core.interference import ModeParams

ENV = {"measured_on": "synthetic", "device_name": "NVIDIA H100 80GB HBM3", "driver": "test",
       "cuda": "test", "torch": "test", "date_utc": "2026-01-01"}
# name -> (sm, dram, solo samples/s)
PROFILES = {
    "resnet18-cifar": (0.35, 0.20, 4000.0),
    "resnet50-64": (0.55, 0.30, 2500.0),
    "resnet50-224": (0.85, 0.35, 900.0),
    "resnet152": (0.82, 0.30, 350.0),
    "transformer-encoder": (0.75, 0.45, 600.0),
    "dlrm": (0.05, 0.10, 300000.0),
}
MIXES = [
    ("resnet152", "dlrm"), ("resnet152", "resnet18-cifar"), ("resnet50-224", "resnet18-cifar"),
    ("resnet50-64", "resnet18-cifar"), ("transformer-encoder", "dlrm"),
    ("transformer-encoder", "resnet50-224"), ("resnet152", "resnet50-64", "resnet18-cifar"),
    ("resnet18-cifar", "resnet18-cifar"), ("dlrm", "dlrm"), ("resnet50-64", "resnet50-64"),
    ("resnet18-cifar",) * 3, ("resnet152",) * 2, ("dlrm",) * 7, ("resnet18-cifar",) * 7,
]
TRUE = {
    "time-slicing": ModeParams(base=0.05, per_sm=0.12, per_dram=0.06, saturation_exponent=0.9),
    "mps": ModeParams(base=0.03, per_sm=0.02, per_dram=0.10, saturation_exponent=1.1),
}
POWER = (70.0, 650.0, 1.4)  # idle, max, exponent


def _alone(name: str) -> dict:
    sm, dram, rate = PROFILES[name]
    return {"scenario": f"alone:{name}", "kind": "alone", "sharing": "alone", "workloads": [name],
            "copies": 1, "status": "ok", "reason": "", "env": ENV,
            "gpu": {"sm_activity": sm, "dram_activity": dram, "power_watts": _power(sm),
                    "used_mib_max": 5000.0, "process_mem_mib": {"100": 4000.0}},
            "jobs": [{"workload": name, "status": "ok", "pid": 100, "samples_per_s": rate,
                      "steps_per_s": rate / 64, "batch_size": 64, "startup_s": 6.0,
                      # the 3 warm-up steps cost 2 s beyond the steady rate (cuDNN autotuning)
                      "warmup_steps": 3, "warmup_s": 3 / (rate / 64) + 2.0,
                      "time_per_epoch_s": 50000 / rate, "max_memory_reserved_mib": 3000.0}]}


def _power(busy: float) -> float:
    idle, top, e = POWER
    return idle + (top - idle) * min(1.0, busy) ** e


def synthetic_records(params: Mapping[str, ModeParams] = TRUE, *, noise: float = 0.0,
                      seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = [{"scenario": "idle", "kind": "idle", "sharing": "none", "workloads": [],
                "copies": 0, "status": "ok", "reason": "", "env": ENV, "jobs": [],
                "gpu": {"power_watts": POWER[0]}}]
    records += [_alone(n) for n in PROFILES]
    for mode, p in params.items():
        for mix in MIXES:
            jobs = []
            for i, name in enumerate(mix):
                others = [PROFILES[m] for k, m in enumerate(mix) if k != i]
                sm, dram, rate = PROFILES[name]
                obs = Observation(sm, dram, sum(o[0] for o in others), sum(o[1] for o in others),
                                  0.0, "")
                slow = float(predict(p, [obs])[0]) * (1 + noise * rng.standard_normal())
                jobs.append({"workload": name, "status": "ok", "pid": 200 + i,
                             "samples_per_s": rate / slow, "time_per_epoch_s": 50000 * slow / rate})
            busy = sum(PROFILES[n][0] for n in mix)
            kind = "copies" if len(set(mix)) == 1 else "mix"
            records.append({"scenario": f"{mode}:{'+'.join(mix)}", "kind": kind, "sharing": mode,
                            "workloads": list(mix), "copies": len(mix), "status": "ok",
                            "reason": "", "env": ENV, "jobs": jobs,
                            "gpu": {"sm_activity": min(1.0, busy), "power_watts": _power(busy),
                                    "used_mib_max": 9000.0}})
    return records
