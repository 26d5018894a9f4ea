"""MIG profile tables: what each MIG instance of a GPU type offers.

One data module so the emulated backend (which builds instances from it) and the NVML backend
(which names real instances with it) agree. Sizes come from real ``nvidia-smi mig -lgip`` output
collected in the project's GPU notes (``gpu-facts.md`` §2.4); where drivers print slightly
different memory sizes we take the smaller one, so an emulated instance never offers more than a
real one. ``memory_slices`` of 8 and ``compute_slices`` of 7 drive the placement rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collocate.common.errors import InputError, UnknownNameError
from collocate.core.gputypes import GPU_TYPES

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile. ``memory_mib``/``sm_count`` are None where never measured."""

    name: str  # e.g. "3g.20gb"
    compute_slices: int
    memory_slices: int
    memory_mib: float | None
    sm_count: int | None
    max_instances: int
    starts: tuple[int, ...]  # memory-slice positions an instance may start at (-lgipp)


def _gib(value: float) -> float:
    return value * 1024.0


_Row = tuple[str, int, int, float | None, int | None, int]


def _table(rows: list[_Row]) -> dict[str, MigProfile]:
    out: dict[str, MigProfile] = {}
    for name, cslices, mslices, gib, sms, count in rows:
        if cslices == 7:
            starts: tuple[int, ...] = (0,)
        elif cslices == 4:
            starts = (0,)
        elif cslices == 3:
            starts = (0, 4)
        elif cslices == 2:
            starts = (0, 2, 4)
        elif mslices == 2:  # a 1g profile with twice the memory
            starts = (0, 2, 4, 6)
        else:
            starts = tuple(range(7))
        out[name] = MigProfile(
            name, cslices, mslices, None if gib is None else _gib(gib), sms, count, starts
        )
    return out


# (name, compute slices, memory slices, memory GiB, SMs, max instances)
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table([
        ("1g.5gb", 1, 1, 4.75, 14, 7),
        ("1g.5gb+me", 1, 1, 4.75, 14, 1),
        ("1g.10gb", 1, 2, 9.62, 14, 4),
        ("2g.10gb", 2, 2, 9.62, 28, 3),
        ("3g.20gb", 3, 4, 19.50, 42, 2),
        ("4g.20gb", 4, 4, 19.50, 56, 1),
        ("7g.40gb", 7, 8, 39.25, 98, 1),
    ]),
    "A100-80GB": _table([
        ("1g.10gb", 1, 1, 9.50, 14, 7),
        ("1g.10gb+me", 1, 1, 9.50, 14, 1),
        ("1g.20gb", 1, 2, 19.50, 14, 4),
        ("2g.20gb", 2, 2, 19.50, 28, 3),
        ("3g.40gb", 3, 4, 39.25, 42, 2),
        ("4g.40gb", 4, 4, 39.25, 56, 1),
        ("7g.80gb", 7, 8, 78.50, 98, 1),
    ]),
    "H100-80GB": _table([
        ("1g.10gb", 1, 1, 9.75, 16, 7),
        ("1g.10gb+me", 1, 1, 9.75, 16, 1),
        ("1g.20gb", 1, 2, 19.62, 26, 4),
        ("2g.20gb", 2, 2, 19.62, 32, 3),
        ("3g.40gb", 3, 4, 39.50, 60, 2),
        ("4g.40gb", 4, 4, 39.50, 64, 1),
        ("7g.80gb", 7, 8, 79.25, 132, 1),
    ]),
    "H200-141GB": _table([
        ("1g.18gb", 1, 1, 16.00, 16, 7),
        ("1g.18gb+me", 1, 1, 16.00, 16, 1),
        ("1g.35gb", 1, 2, 32.25, 26, 4),
        ("2g.35gb", 2, 2, 32.25, 32, 3),
        ("3g.71gb", 3, 4, 69.50, 60, 2),
        ("4g.71gb", 4, 4, 69.50, 64, 1),
        ("7g.141gb", 7, 8, None, None, 1),  # name confirmed; size and SMs never captured
    ]),
}

_NAME_IN_PRODUCT = re.compile(r"\bMIG\s+(?:\d+c\.)?(\d+g\.\d+gb(?:\+me)?)\b", re.IGNORECASE)


def profiles_for(type_name: str) -> dict[str, MigProfile]:
    """The profile table of a GPU type; error listing the MIG-capable types otherwise."""
    try:
        return MIG_PROFILES[type_name]
    except KeyError:
        raise UnknownNameError("MIG-capable GPU type", type_name, list(MIG_PROFILES)) from None


def mig_profile(type_name: str, name: str) -> MigProfile:
    """Look up one profile, e.g. ``mig_profile("A100-40GB", "3g.20gb")``."""
    table = profiles_for(type_name)
    try:
        return table[name]
    except KeyError:
        raise UnknownNameError(f"MIG profile of {type_name}", name, list(table)) from None


def full_gpu_sm_count(type_name: str, fallback: int) -> int:
    """SMs of the whole-GPU (7g) instance: the reference an instance's SM fraction is taken of."""
    for profile in MIG_PROFILES.get(type_name, {}).values():
        if profile.compute_slices == COMPUTE_SLICES and profile.sm_count:
            return profile.sm_count
    return fallback


def sm_fraction(type_name: str, sm_count: int | None, profile: str | None = None) -> float:
    """A MIG instance's share of its GPU's SMs: the ``speed`` policies, the world and both
    worlds' slowdown take it at (``collocate.core.interference``), computed here once for the NVML
    backend, the emulated one and the simulator.

    Its SMs (``sm_count``, as read or as the table says) over the whole-GPU (7g) instance's (the
    GPU type's SMs where the table lacks it; on H100 these are not multiples of 1/7); where its
    SMs are unknown, its compute slices (``profile`` in the table) over 7; where neither is
    known, 1.0, which treats the instance as a whole GPU."""
    known = GPU_TYPES.get(type_name)
    full = full_gpu_sm_count(type_name, known.sm_count if known else 0)
    if sm_count and full > 0:
        return min(1.0, sm_count / full)
    table = MIG_PROFILES.get(type_name, {})
    if profile in table:
        return table[profile].compute_slices / COMPUTE_SLICES
    return 1.0


def profile_from_device_name(product: str) -> str | None:
    """The profile in an NVML MIG device name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb" → "3g.20gb"."""
    match = _NAME_IN_PRODUCT.search(product)
    return match[1].lower() if match else None


def profile_from_slices(type_name: str, compute_slices: int, memory_mib: float) -> str | None:
    """Name an instance from its slice count and memory when its device name lacks the profile."""
    best: tuple[float, str] | None = None
    for profile in MIG_PROFILES.get(type_name, {}).values():
        if profile.compute_slices != compute_slices or profile.name.endswith("+me"):
            continue
        size = profile.memory_mib if profile.memory_mib is not None else float("inf")
        gap = abs(size - memory_mib)
        if best is None or gap < best[0]:
            best = (gap, profile.name)
    return best[1] if best else None


def split_profiles(text: str) -> list[str]:
    """``"1g.5gb+me+3g.20gb"`` → ``["1g.5gb+me", "3g.20gb"]`` (``+me`` belongs to its profile):
    a layout as ``simulate --mig-layout`` and the emulated backend's ``:mig=`` read it."""
    names: list[str] = []
    for part in (p.strip() for p in text.split("+")):
        if part.lower() == "me" and names:
            names[-1] += "+me"
        else:
            names.append(part)
    if not all(names):
        raise InputError(
            f"empty MIG profile name in layout {text!r}",
            hint="join profile names with +, e.g. 3g.20gb+4g.20gb",
        )
    return names


def place(type_name: str, names: list[str] | tuple[str, ...]) -> list[int]:
    """Find memory-slice start positions for these instances on one GPU, as the driver would.

    Returns one start per profile (same order). Raises ``InputError`` naming the conflict when the
    set does not fit: too many compute slices, too many instances of a profile, or no placement.
    """
    profiles = [mig_profile(type_name, n) for n in names]
    if not profiles:
        raise InputError(
            "no MIG instances requested", hint="name at least one profile, e.g. 3g.20gb"
        )
    total = sum(p.compute_slices for p in profiles)
    if total > COMPUTE_SLICES:
        raise InputError(
            f"MIG instances {'+'.join(names)} need {total} compute slices;"
            f" a GPU has {COMPUTE_SLICES}",
            hint="drop or shrink an instance (e.g. 3g + 4g, or seven 1g)",
        )
    for name in set(names):
        allowed = mig_profile(type_name, name).max_instances
        if names.count(name) > allowed:
            raise InputError(
                f"at most {allowed} instance(s) of {name} fit on a {type_name}",
                hint="use a smaller count or another profile",
            )
    order = sorted(range(len(profiles)), key=lambda i: -profiles[i].memory_slices)
    starts: list[int] = [0] * len(profiles)
    used = [False] * MEMORY_SLICES

    def search(k: int) -> bool:
        if k == len(order):
            return True
        p = profiles[order[k]]
        for start in p.starts:
            span = range(start, start + p.memory_slices)
            if span.stop <= MEMORY_SLICES and not any(used[s] for s in span):
                for s in span:
                    used[s] = True
                starts[order[k]] = start
                if search(k + 1):
                    return True
                for s in span:
                    used[s] = False
        return False

    if not search(0):
        raise InputError(
            f"MIG instances {'+'.join(names)} cannot be placed together on a {type_name}",
            hint="the GPU has 8 memory slices; "
            "e.g. 4g.20gb + 3g.20gb or 3g.20gb + 2g.10gb + 1g.5gb fit",
        )
    return starts
