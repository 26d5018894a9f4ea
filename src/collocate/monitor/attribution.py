"""Split one device's measured energy and time among the jobs that shared it (pure arithmetic).

Why a rule at all: NVML measures energy per *device* (a millijoule counter, or instantaneous
power), never per process. When several jobs share a GPU, each job's cost has to be derived
from what *is* per process: which processes hold memory on the device (occupancy) and each
process's SM utilization (``ProcessUsage.sm_util``). The rule is deliberately simple, so a user
can recompute a bill by hand, and exact: the parts always add up to the device's measurement.

The rule, for one device and one interval between two consecutive samples ``s0`` and ``s1``
(``dt = s1.time - s0.time``):

1. **Energy of the interval** ``E``: the counter delta ``s1.energy_joules - s0.energy_joules``
   when both readings have the counter and it did not go backwards (a driver reload resets it);
   otherwise power x time, ``(p0 + p1) / 2 * dt`` (or the one power reading there is); otherwise
   unknown (``None``): time is still attributed, energy is not.
2. **Owners**: every process seen on the device in ``s0`` or ``s1`` belongs to the job whose
   process tree holds its pid, or to ``OTHER`` (processes no job owns: a user outside the
   daemon, a leftover). A job's utilization ``u`` is the mean over ``s0`` and ``s1`` of the sum of
   its processes' ``sm_util`` (a process absent from a sample counts 0 there; ``None`` counts 0).
3. **Static (idle) part** ``E_s = min(E, P_idle * dt)``: the power the device draws just by being
   on. It is split *equally* among the owners present (occupancy time: holding memory on the GPU
   keeps it from being given to someone else, busy or not). With no owner it goes to ``IDLE``.
   ``P_idle`` comes from the device type when known, else it is the lowest power seen on that
   device so far (see ``UsageSampler``); without it ``E_s = 0``.
4. **Dynamic part** ``E_d = E - E_s``: split in proportion to the owners' ``u``; when no owner
   reports utilization (all ``u == 0`` or unknown) it is split equally; with no owner, ``IDLE``.
   **Helpers and readings that miss jobs.** Under MPS the driver charges every client's SM
   utilization to the MPS server, and jobs read 0 (docs/gpu-validation.md). A helper process
   (``helpers``: the MPS server) is no owner; and when no job owner reports utilization but the
   device reads SM activity beyond what ``OTHER`` reports (GPM's, else NVML's utilization), each job's ``u`` is that reading
   split in proportion to ``expected`` (what each job is expected to draw: its solo SM activity
   times its progress rate under the interference model, from the daemon), or equally. So a job
   that ran is never charged 0% and no GPU time.
5. **GPU time** ``dt`` is split by the same weights as the dynamic part (so an owner that used
   70% of the SM activity of a shared GPU is charged 70% of its time); a job also accrues
   ``occupancy_s = dt`` (wall time it held the device), which is what an exclusive booking costs.

Invariants (property-tested): every share is >= 0, and over one interval the shares of the jobs
plus ``OTHER`` plus ``IDLE`` equal ``E`` (and ``dt`` for time) up to float rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from collocate.gpus.base import DeviceSample

OTHER = "<other>"  # processes on the device that no job owns
IDLE = "<idle>"  # energy/time of a device with no process on it


@dataclass(frozen=True, slots=True)
class Share:
    """What one owner (a job id, ``OTHER`` or ``IDLE``) is charged for one interval of a device."""

    energy_j: float | None  # None when the device's energy for the interval is unknown
    gpu_time_s: float  # share of device time (sums to dt over owners)
    occupancy_s: float  # wall time holding the device (dt for each owner present)
    sm_activity: float  # the owner's mean SM utilization over the interval, fraction of the device
    mem_mib: float  # memory held at the end of the interval (max of the two samples if gone)


@dataclass(frozen=True, slots=True)
class Attribution:
    """The split of one interval on one device."""

    uuid: str
    start: float
    end: float
    energy_j: float | None  # the device's measured energy for the interval
    energy_source: str  # "counter", "power", or "none"
    shares: Mapping[str, Share] = field(default_factory=dict)

    @property
    def dt(self) -> float:
        return self.end - self.start


def interval_energy(s0: DeviceSample, s1: DeviceSample) -> tuple[float | None, str]:
    """Energy between two samples of one device and where it came from (rule step 1)."""
    dt = max(0.0, s1.time - s0.time)
    if s0.energy_joules is not None and s1.energy_joules is not None:
        delta = s1.energy_joules - s0.energy_joules
        if delta >= 0:
            return delta, "counter"
    powers = [p for p in (s0.power_watts, s1.power_watts) if p is not None]
    if powers:
        return max(0.0, sum(powers) / len(powers)) * dt, "power"
    return None, "none"


def attribute(
    s0: DeviceSample,
    s1: DeviceSample,
    owner_of: Mapping[int, str],
    *,
    idle_watts: float | None = None,
    helpers: frozenset[int] = frozenset(),
    expected: Mapping[str, float] | None = None,
) -> Attribution:
    """Split the interval ``s0 -> s1`` of one device among owners (see the module docstring).

    ``owner_of`` maps a pid to its job id; pids not in it are charged to ``OTHER``. The samples
    must be of the same device, in time order; a zero or negative ``dt`` charges nothing.
    """
    if s0.uuid != s1.uuid:
        raise ValueError(f"samples of different devices: {s0.uuid} and {s1.uuid}")
    dt = max(0.0, s1.time - s0.time)
    energy, source = interval_energy(s0, s1)
    util: dict[str, float] = {}
    mem: dict[str, list[float]] = {}
    for k, sample in enumerate((s0, s1)):
        for p in sample.processes:
            if p.pid in helpers and p.pid not in owner_of:
                continue
            owner = owner_of.get(p.pid, OTHER)
            util[owner] = util.get(owner, 0.0) + max(0.0, p.sm_util or 0.0) / 2.0
            held = mem.setdefault(owner, [0.0, 0.0])
            held[k] += max(0.0, p.used_mib)
    owners = sorted(util)
    _split_device_reading(util, (s0, s1), expected or {})
    if not owners:
        share = Share(energy, dt, dt, 0.0, 0.0)
        return Attribution(s0.uuid, s0.time, s1.time, energy, source, {IDLE: share})
    weights = _weights([util[o] for o in owners])
    static = 0.0
    if energy is not None and idle_watts is not None:
        static = min(energy, max(0.0, idle_watts) * dt)
    dynamic = None if energy is None else energy - static
    shares = {}
    for owner, w in zip(owners, weights, strict=True):
        e = None if dynamic is None else static / len(owners) + dynamic * w
        end_mem = mem[owner][1] if mem[owner][1] > 0 else mem[owner][0]
        shares[owner] = Share(e, dt * w, dt, min(1.0, util[owner]), end_mem)
    return Attribution(s0.uuid, s0.time, s1.time, energy, source, shares)


def _split_device_reading(util: dict[str, float], samples: tuple[DeviceSample, DeviceSample],
                          expected: Mapping[str, float]) -> None:
    """Give job owners the device's SM reading when none of them reports its own (rule 2b)."""
    jobs = [o for o in util if o not in (OTHER, IDLE)]
    if not jobs or any(util[o] > 0 for o in jobs):
        return
    readings = [s.sm_activity if s.sm_activity is not None else s.gpu_util for s in samples]
    known = [r for r in readings if r is not None]
    device = sum(known) / len(known) if known else 0.0
    device -= util.get(OTHER, 0.0)  # what processes no job owns report is theirs
    if device <= 0:
        return
    weights = [max(0.0, expected.get(o, 0.0)) for o in jobs]
    if sum(weights) <= 0:
        weights = [1.0] * len(jobs)
    total = sum(weights)
    for o, w in zip(jobs, weights, strict=True):
        util[o] = min(1.0, device) * w / total


def _weights(utils: list[float]) -> list[float]:
    """Proportional weights that sum to exactly 1 (equal when nobody reports utilization)."""
    total = sum(utils)
    if total <= 0:
        return [1.0 / len(utils)] * len(utils)
    weights = [u / total for u in utils]
    weights[-1] = max(0.0, 1.0 - sum(weights[:-1]))  # absorb rounding so the sum is exact
    return weights
