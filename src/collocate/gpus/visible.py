"""Which of a node's GPUs this daemon or agent may use, from what the job scheduler set.

NVML lists every GPU the process can open, but under Slurm (or any launcher that hands out GPUs)
a node's other GPUs belong to other allocations. The scheduler says which are ours in the
environment; the NVML backend keeps only those devices (``select_devices``). One rule, here:

* ``CUDA_VISIBLE_DEVICES`` wins when it is set. It is what CUDA itself honours, and it is in
  NVML's numbering in both Slurm set-ups: with ``ConstrainDevices=yes`` the cgroup hides the other
  GPUs, NVML numbers the allocation's GPUs from 0, and Slurm writes the variable relative to the
  cgroup; without it NVML sees every GPU and the variable holds their global indices.
* else ``SLURM_STEP_GPUS`` (the step's GPUs), else ``SLURM_JOB_GPUS``: global indices, not
  relative to the cgroup. Under ``ConstrainDevices=yes`` they match NVML's numbering only when the
  allocation is GPUs 0..k-1; otherwise an index is missing and ``select_devices`` says so (a
  wrong GPU is never chosen silently: k distinct global indices all below k are exactly 0..k-1).

An entry is an NVML index, a ``GPU-...`` UUID or a ``MIG-...`` UUID (mixed is fine). An index or
GPU UUID of a GPU in MIG mode allows all its MIG instances; a MIG UUID allows that instance only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collocate.common.errors import InputError
from collocate.gpus.base import DeviceInfo

VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")  # first set wins


@dataclass(frozen=True)
class Visible:
    """The allowed devices as one variable names them (``entries`` in its order)."""

    variable: str
    entries: tuple[str, ...]


def visible_from_env(env: Mapping[str, str]) -> Visible | None:
    """The restriction ``env`` sets, or None when no variable is set (every GPU is ours)."""
    for variable in VARIABLES:
        value = env.get(variable)
        if value is None:
            continue
        entries = tuple(e.strip() for e in value.split(",") if e.strip())
        if not entries:
            raise InputError(
                f"{variable} is set but empty, so no GPU may be used",
                hint=f"unset {variable} to use every GPU NVML sees, or list the GPUs to use",
            )
        for entry in entries:
            if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
                raise InputError(
                    f"{variable}={value!r}: {entry!r} is not a GPU index, GPU-... or MIG-... UUID",
                    hint="list indices or UUIDs as `nvidia-smi -L` prints them, comma-separated",
                )
        return Visible(variable, entries)
    return None


def allows(entry: str, device: DeviceInfo) -> bool:
    """Whether one entry names ``device`` (a whole GPU, or a MIG instance of a named GPU)."""
    if entry.isdigit():
        return device.id.index == int(entry)
    return entry in (device.uuid, device.parent_uuid)


def select_devices(visible: Visible | None, devices: Sequence[DeviceInfo]) -> list[DeviceInfo]:
    """The devices ``visible`` allows, in NVML's order; an entry that names none is an error."""
    if visible is None:
        return list(devices)
    missing = [e for e in visible.entries if not any(allows(e, d) for d in devices)]
    if missing:
        seen = ", ".join(
            f"{d.id.index} {d.uuid}" + (f" (on {d.parent_uuid})" if d.parent_uuid else "")
            for d in devices
        )
        hint = f"set {visible.variable} to GPUs NVML sees, or unset it"
        if visible.variable != "CUDA_VISIBLE_DEVICES":
            hint += (
                f"; {visible.variable} holds global indices, which NVML does not use when "
                "Slurm confines the job's devices (ConstrainDevices=yes): set "
                "CUDA_VISIBLE_DEVICES, which Slurm writes relative to the cgroup"
            )
        raise InputError(
            f"{visible.variable} names {', '.join(missing)}, which NVML does not see on this "
            f"node; NVML sees: {seen or 'no GPU'}",
            hint=hint,
        )
    return [d for d in devices if any(allows(e, d) for e in visible.entries)]
