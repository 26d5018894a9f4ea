"""What the world model (``collocate.core.world``) keeps of each device, in one table.

Every per-device fact is a column of ``DeviceTable``, declared once with its initial value: a
numpy array where policies read it in bulk (the snapshot of 1,000 GPUs is these arrays, not a
copy), a list where it is an object (a device's readings and segment). ``extend`` grows every
column by iterating the declared fields, so a device that joins (a node of a cluster) shows in
every view: a column added is a field added here, and nothing else has to remember it (once, a
missed array broke ``collocate gpus`` after a node joined).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from collocate.core.belief import Joint
from collocate.core.model import GpuId


@dataclass(frozen=True, slots=True)
class Device:
    """A schedulable device as the world needs it: its id, memory and share of a GPU's SMs."""

    id: GpuId
    total_mib: float
    speed: float = 1.0


@dataclass(slots=True)
class Segment:
    """A stretch of one device's readings with the same active residents, none warming."""

    members: tuple[str, ...]
    start: float  # readings from here on count (a change plus the reading lag)
    seconds: float = 0.0
    sm: float = 0.0  # moving averages of the readings (``World.average_s``)
    dram: float = 0.0
    has_dram: bool = True
    paused: bool = False  # a member's processes hold nothing: its readings are not learned from
    revised: Joint | None = None  # the device's joint belief once the segment has taught it


@dataclass(slots=True)
class DeviceState:
    """A device's residents, its latest levels and what its readings are teaching."""

    residents: dict[str, None] = field(default_factory=dict)  # job ids, in placement order
    sm: float = 0.0  # the level it reads now
    dram: float | None = 0.0
    occupancy: float | None = None
    level_at: float = -math.inf  # since when
    baseline: float = 0.0  # what it read when its newest warming job appeared
    segment: Segment | None = None
    joint: Joint = field(default_factory=lambda: Joint.of({}))  # what ended segments taught
    epoch: int = 0  # bumped on every segment change (stale wake-ups are ignored)
    window: tuple[deque, deque, deque] | None = None  # the risk filter's (sm, occupancy, dram)


def _column(fill: float | Callable[[Device], float] = 0.0, dtype: type = float) -> Any:
    """A numeric column: each new device's value is ``fill`` (or ``fill(device)``)."""
    return field(metadata={"fill": fill, "dtype": dtype})


def _rows(make: Callable[[], object]) -> Any:
    """A column of objects: each new device gets ``make()``."""
    return field(metadata={"make": make})


@dataclass(slots=True, eq=False)
class DeviceTable:
    """Per-device state, one column per field, position ``i`` for the world's device ``i``."""

    total: np.ndarray = _column(lambda d: d.total_mib)
    speed: np.ndarray = _column(lambda d: d.speed)  # share of a GPU's SMs (a MIG instance < 1)
    free: np.ndarray = _column(lambda d: d.total_mib)  # measured free memory
    committed: np.ndarray = _column()  # what the residents commit
    other: np.ndarray = _column()  # memory of processes that are no resident's
    n_jobs: np.ndarray = _column(dtype=np.int64)
    n_starting: np.ndarray = _column(dtype=np.int64)  # residents not yet working (``Resident.starting``)
    n_frozen: np.ndarray = _column(dtype=np.int64)  # residents frozen by the scheduler (``holds_room``)
    sm_sum: np.ndarray = _column()  # the residents' priced solo activity
    dram_sum: np.ndarray = _column()
    sm_known: np.ndarray = _column()  # solo SM of the working residents observed, not guessed
    seen_at: np.ndarray = _column(-math.inf)  # the newest resident first seen (inf: not yet)
    util_sm: np.ndarray = _column()  # the risk filter's summary of the readings
    util_occ: np.ndarray = _column()
    util_dram: np.ndarray = _column()
    slowed: np.ndarray = _column()  # the largest measured slowdown of each device's residents
    level_sm: np.ndarray = _column()  # the SM level each device reads now (relative to its SMs)
    load_sm: np.ndarray = _column()  # its moving average over ``average_s``, as of ``load_at``
    load_at: np.ndarray = _column(-math.inf)
    owner: list[str] = _rows(str)  # under MPS, the user whose jobs it serves ("" when none)
    state: list[DeviceState] = _rows(DeviceState)

    @classmethod
    def of(cls, devices: Sequence[Device]) -> DeviceTable:
        """A table of these devices, each as it starts: empty, unmeasured."""
        return cls(**{f.name: _new(f, devices) for f in fields(cls)})

    def extend(self, devices: Sequence[Device]) -> None:
        """Append these devices to every column (the others keep their positions)."""
        for f in fields(self):
            old, new = getattr(self, f.name), _new(f, devices)
            setattr(self, f.name, old + new if isinstance(old, list) else np.concatenate([old, new]))


def _new(f: Any, devices: Sequence[Device]) -> Any:  # the column's type, by ``f``
    if "make" in f.metadata:
        return [f.metadata["make"]() for _ in devices]
    fill = f.metadata["fill"]
    values = [fill(d) for d in devices] if callable(fill) else [fill] * len(devices)
    return np.array(values, dtype=f.metadata["dtype"])
