"""How much collocated jobs slow each other down, and what a GPU draws doing it.

One model serves the simulator (job progress and energy), the ``auto`` policy (predicted
slowdown of a candidate placement) and emulated jobs (so the demo shows real trade-offs).
The formulas and the provenance of every parameter are in ``data/interference.toml``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from collocate.common.errors import InputError
from collocate.core.model import JobProfile, SharingMode


@dataclass(frozen=True, slots=True)
class ModeParams:
    base: float
    per_sm: float = 0.0
    per_dram: float = 0.0
    saturation_exponent: float = 1.0


@dataclass(frozen=True, slots=True)
class InstanceParams:
    """How much slower a job runs alone on a MIG instance than alone on its whole GPU:
    ``(1 + base) · max(1, a / f) ** speed_exponent`` for solo SM activity ``a`` on an instance
    with ``f`` of the GPU's SMs. A fact of the partition, the same whatever sharing mode its
    jobs share it by (``data/interference.toml``, ``[mig]``)."""

    base: float = 0.0
    speed_exponent: float = 1.0


@dataclass(frozen=True, slots=True)
class InterferenceModel:
    modes: dict[SharingMode, ModeParams]
    instance: InstanceParams = InstanceParams()
    power_exponent: float = 1.0
    #: A GPU whose process is in its first steps (cuDNN autotuning, allocator growth) runs almost
    #: no SM activity but draws well above idle; power is computed as if busy were at least this.
    warmup_busy: float = 0.0
    #: Per sharing mode, ``log(measured / predicted)`` of each job of the calibration, predicted
    #: by the model fitted without that job's mix: how wrong the model is on a mix it has not
    #: seen. Only the simulator's ``--model-error`` reads it (``collocate.sim.model_error``).
    held_out_log_errors: Mapping[SharingMode, tuple[float, ...]] = field(default_factory=dict)

    def slowdown(
        self,
        mode: SharingMode,
        job: JobProfile,
        others: Sequence[JobProfile] = (),
        *,
        speed: float = 1.0,
    ) -> float:
        """Factor (>= 1) by which ``job`` runs slower than alone on a whole GPU, on a device with
        ``speed`` of its GPU's SMs (a MIG instance; 1: a whole GPU) that ``others`` share with it
        by ``mode``: what it loses to the instance alone (``alone``) times what it loses to its
        neighbours there (``device_slowdown``). The one rule the simulator's progress, its model
        error and emulated jobs run by; ``auto`` scores the same formula over arrays, and the
        world reports ``device_slowdown``, the part neighbours cause."""
        if speed >= 1.0:  # a whole GPU: ``device_slowdown`` inlined (the simulator's hot path)
            if not others:
                return 1.0
            return float(shared_slowdown(self.modes[mode], job.sm_activity, job.dram_activity,
                                         sum(o.sm_activity for o in others), sum(o.dram_activity for o in others)))
        solo = self.alone(job, speed)
        return solo * device_slowdown(self.modes[mode], job, others, speed) if others else solo

    def alone(self, job: JobProfile, speed: float) -> float:
        """Factor by which ``job`` alone on a device with ``speed`` of its GPU's SMs runs slower
        than alone on the whole GPU (``InstanceParams``; 1 on a whole GPU)."""
        if speed >= 1.0:
            return 1.0
        p = self.instance
        return (1.0 + p.base) * max(1.0, on_device(job.sm_activity, speed)) ** p.speed_exponent

    def busy_fraction(self, profiles: Sequence[JobProfile]) -> float:
        """Fraction of the GPU's SMs kept busy by these jobs together (for power and SM util):
        the capped sum of the activities given. Pass each job's activity at its current rate
        (solo activity / slowdown) to get what the GPU reads; this function divides by nothing."""
        return min(1.0, sum(p.sm_activity for p in profiles))

    def power_watts(self, idle_watts: float, max_watts: float, profiles: Sequence[JobProfile]) -> float:
        busy = self.busy_fraction(profiles)
        return idle_watts + (max_watts - idle_watts) * busy**self.power_exponent


def on_device(activity, speed):
    """Activity taken against a whole GPU's SMs (a job's solo profile, a sum of them), as a device
    with ``speed`` of those SMs counts it: a MIG instance's counters read against its own SMs,
    so a job keeping 20% of an A100 busy keeps 47% of a 3g instance busy; on a whole GPU
    (``speed`` 1) it is the activity itself. Everything that relates activity to an instance
    (the slowdown below, ``auto``'s scores, the world's readings, the emulated backend's samples,
    the simulator's timelines) goes through here. A reading saturates at 1, so callers that read
    one take ``min(1, ...)``; sums a policy prices may exceed it. Floats and numpy arrays alike."""
    return activity / speed


def device_slowdown(p: ModeParams, job: JobProfile, others: Sequence[JobProfile], speed: float = 1.0) -> float:
    """Factor (>= 1) by which ``job`` runs slower beside ``others`` than alone on the same device,
    a whole GPU or a MIG instance with ``speed`` of its GPU's SMs, shared by the mode of ``p``:
    inside an instance activities count relative to it (``on_device``, at most 1 per job), so a
    job that keeps 30% of a whole GPU busy saturates a 1g slice of an A100."""
    if not others:
        return 1.0
    if speed >= 1.0:
        return float(shared_slowdown(p, job.sm_activity, job.dram_activity,
                                     sum(o.sm_activity for o in others), sum(o.dram_activity for o in others)))
    sm, dram = min(1.0, on_device(job.sm_activity, speed)), min(1.0, on_device(job.dram_activity, speed))
    return float(shared_slowdown(p, sm, dram, sum(min(1.0, on_device(o.sm_activity, speed)) for o in others),
                                 sum(min(1.0, on_device(o.dram_activity, speed)) for o in others)))


def shared_slowdown(p: ModeParams, sm, dram, other_sm, other_dram):
    """The sharing formula for time-slicing and MPS; works on floats and numpy arrays alike, so
    the ``auto`` policy can score a thousand candidate GPUs in one call. Never below 1: sharing
    does not speed a job up, whatever a fitted (negative) base says for light co-runners."""
    sharing = 1.0 + p.base + p.per_sm * other_sm + p.per_dram * other_dram
    e = p.saturation_exponent
    if isinstance(sharing, np.ndarray):
        if e:
            total = np.maximum(sm + other_sm, dram + other_dram)
            np.maximum(total, 1.0, out=total)
            sharing = sharing * (total if e == 1.0 else total**e)
        return np.maximum(sharing, 1.0)
    # the simulator's per-job path: builtins beat numpy on scalars by far, and a power costs more
    # than the rest, so skip it where the exponent allows
    if e:
        total = max(sm + other_sm, dram + other_dram, 1.0)
        if total > 1.0:
            sharing *= total if e == 1.0 else total**e
    return sharing if sharing > 1.0 else 1.0


def load_interference(path: Path | None = None) -> InterferenceModel:
    """Read the model from a TOML file (the packaged default when ``path`` is None)."""
    if path is None:
        return default_interference()
    try:
        return _parse(tomllib.loads(path.read_text()), str(path))
    except OSError as exc:
        raise InputError(f"cannot read interference model {path}: {exc}") from exc


@cache
def default_interference() -> InterferenceModel:
    text = resources.files("collocate").joinpath("data/interference.toml").read_text()
    return _parse(tomllib.loads(text), "collocate/data/interference.toml")


def _parse(doc: dict, where: str) -> InterferenceModel:
    modes: dict[SharingMode, ModeParams] = {}
    instance = doc.get("mig", {})
    for name, values in doc.get("modes", {}).items():
        if name == "mig" and not instance:  # written before MIG left the sharing modes
            instance = values
            continue
        try:
            mode = SharingMode(name)
        except ValueError:
            raise InputError(
                f"{where}: unknown sharing mode [modes.{name}]",
                hint=f"use one of {', '.join(m.value for m in SharingMode)}",
            ) from None
        fields = {k: float(v) for k, v in values.items() if k != "provenance"}
        try:
            modes[mode] = ModeParams(**fields)
        except TypeError as exc:
            raise InputError(f"{where}: [modes.{name}]: {exc}") from None
    missing = [m.value for m in SharingMode if m not in modes]
    if missing:
        raise InputError(f"{where}: no parameters for sharing mode(s) {', '.join(missing)}")
    try:
        mig = InstanceParams(**{k: float(v) for k, v in instance.items() if k != "provenance"})
    except TypeError as exc:
        raise InputError(f"{where}: [mig]: {exc}", hint="give base and speed_exponent") from None
    power = doc.get("power", {})
    errors: dict[SharingMode, tuple[float, ...]] = {}
    for name, values in doc.get("calibration", {}).get("modes", {}).items():
        ratios = values.get("cv_log_ratios") if isinstance(values, dict) else None
        if ratios:
            try:
                errors[SharingMode(name)] = tuple(float(v) for v in ratios)
            except (TypeError, ValueError):
                raise InputError(f"{where}: [calibration.modes.{name}] cv_log_ratios must be a list of numbers "
                                 "for a known sharing mode") from None
    return InterferenceModel(modes, mig, float(power.get("exponent", 1.0)), float(power.get("warmup_busy", 0.0)),
                             errors)
